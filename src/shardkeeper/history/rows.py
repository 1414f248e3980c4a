"""Records to table rows: one row per execution, one per item of a skipped trigger."""

from __future__ import annotations

from typing import Any

from shardkeeper.observe import ExecutionRecord, Outcome, SkipRecord

__all__ = ["WHOLE_FIRE", "execution_row", "skip_rows"]

#: the item of a skip row that concerns the whole fire (its items are not known)
WHOLE_FIRE = -1

Row = dict[str, Any]


def execution_row(record: ExecutionRecord) -> Row:
    """The row of one item execution."""
    return {
        "job": record.job,
        "item": record.item,
        "fire_time": record.fire_time,
        "execution_id": record.execution_id,
        "instance": record.instance,
        "started": record.started,
        "ended": record.ended,
        "duration": record.duration,
        "outcome": str(record.outcome),
        "failover": record.failover,
        "misfire": record.misfire,
        "fencing_token": record.fencing_token,
        "error_type": record.error_type,
        "error_message": record.error_message,
        "traceback": record.traceback,
        "covers": ",".join(f"{t:.3f}" for t in record.covers),
        "scope": record.scope,
        "progress": record.progress,
        "covered_before": record.covered_before,
        "taken_over_from": record.taken_over_from,
        "resumed_from": record.resumed_from,
        "reported_by": record.reported_by,
    }


def skip_rows(record: SkipRecord) -> list[Row]:
    """The rows of one skipped trigger: one per item, or one with item -1."""
    fire_ms = round(record.fire_time * 1000)
    return [
        {
            "job": record.job,
            "item": item,
            "fire_time": record.fire_time,
            # the execution id the item would have had (runtime/fire/batches.py)
            "execution_id": f"{record.job}@{fire_ms}#{item}",
            "instance": record.instance,
            "started": record.fire_time,
            "ended": record.fire_time,
            "duration": 0.0,
            "outcome": str(Outcome.SKIPPED),
            "failover": False,
            "misfire": False,
            "fencing_token": 0,
            "error_type": "",
            "error_message": record.message or record.reason,
            "traceback": "",
            "covers": "",
            "scope": record.scope,
            "progress": "",
            "covered_before": 0,
            "taken_over_from": "",
            "resumed_from": "",
            "reported_by": "",
        }
        for item in (record.items or (WHOLE_FIRE,))
    ]
