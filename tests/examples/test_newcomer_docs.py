"""What the docs say to a newcomer stays true of the code (newcomer review N6, N7, N13,
N16): every outcome an execution can end with is documented wherever outcomes are
listed, the tour's expected output names the items the way ``instances`` prints them,
and the failover promise stays a few pages (its run log lives in validation.md)."""

from __future__ import annotations

import re
from pathlib import Path

from shardkeeper.observe import Outcome

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _line(path: Path, starts: str) -> str:
    """The first line of ``path`` that begins with ``starts``."""
    for line in path.read_text().splitlines():
        if line.startswith(starts):
            return line
    raise AssertionError(f"no line beginning {starts!r} in {path}")


def test_every_outcome_is_documented_where_outcomes_are_listed() -> None:
    """N13: ``crashed`` was missing from monitoring.md and cli.md. Each place that
    lists the outcomes names every value of :class:`Outcome`."""
    history_row = _line(DOCS / "monitoring.md", "| `outcome` |")
    metric_row = _line(DOCS / "monitoring.md", "| `shardkeeper_executions_total` |")
    cli = (DOCS / "cli.md").read_text()
    cli_outcomes = re.search(r"OUTCOME \(([^)]*)", cli)
    assert cli_outcomes is not None
    for outcome in Outcome:
        assert f"`{outcome.value}`" in history_row, outcome
        assert f"`{outcome.value}`" in cli_outcomes.group(1), outcome
        if outcome is not Outcome.SKIPPED:  # a skip is no execution: not counted there
            assert f"`{outcome.value}`" in metric_row, outcome


def test_the_tour_shows_items_as_ranges_and_the_failover_state_it_will_see() -> None:
    """N6, N7: the tour's sample output named items and failover states the CLI does
    not print. ``instances`` prints a member's items as ranges (``0-1``), and a
    failover taken at once reads ``running``."""
    tour = (DOCS / "getting-started.md").read_text()
    assert re.search(r"city-report: 0-1\b", tour), "the instances sample shows ranges"
    assert "`FAILOVER` shows\n  `running`" in tour or "`FAILOVER` shows `running`" in tour


def test_the_failover_promise_is_a_few_pages() -> None:
    """N16: failover.md had grown into a 1,581-line run notebook. The promise stays
    short; the run log is docs/validation.md."""
    text = (DOCS / "failover.md").read_text()
    assert len(text.splitlines()) < 600
    assert "validation.md" in text
    assert not re.search(r"\bseed \d{4,}", text), "seeds belong to the run log"
