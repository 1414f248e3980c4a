"""The JSON REST API under ``/api``: the same reads and operations as the pages.

Reads answer the ``to_dict()`` views of :mod:`shardkeeper.ops.views` (the schemas
of the CLI's ``--json``, documented in docs/cli.md). Errors answer
``{"detail": message, "error": kind}`` with 404 (unknown job or instance), 422
(bad input), 409 (refused in the current state), 503 (store or history
unreachable); 401/403 for missing or insufficient credentials. Every write is
recorded in the audit trail under the token's (or Basic account's) name
(:func:`~shardkeeper.console.audit.audited`); ``GET /api/audit`` reads it.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from shardkeeper.console.audit import audited
from shardkeeper.console.auth import Principal
from shardkeeper.console.context import context_of
from shardkeeper.console.deps import api_reader, api_writer
from shardkeeper.console.forms import ITEM_PAGE, MAX_ITEM_PAGE, history_query, validate_changes
from shardkeeper.errors import ConfigError
from shardkeeper.ops import config_to_dict

__all__ = ["router"]

router = APIRouter(prefix="/api", tags=["api"])
Reader = Annotated[Principal, Depends(api_reader)]
Writer = Annotated[Principal, Depends(api_writer)]
JSON = dict[str, Any]


class TriggerRequest(BaseModel):
    """Run a job's items now: on one live instance (or all), or only some items, with
    one-off params."""

    instance: str | None = Field(default=None, description="Only this instance.")
    params: dict[str, str] = Field(default_factory=dict, description="ctx.params of the run.")
    items: list[int] | None = Field(
        default=None,
        description="Only these items (run by whichever instance owns each); not with instance.",
    )


class InstanceSwitch(BaseModel):
    """Which job an instance switch concerns (None: every job the instance runs)."""

    job: str | None = None


@router.get("/whoami", summary="The caller's name and role")
def whoami(principal: Reader) -> JSON:
    """Who the credentials belong to."""
    return {"name": principal.name, "role": principal.role, "via": principal.via}


@router.get("/status", summary="Live instances and every job with its health")
def status(request: Request, _: Reader) -> JSON:
    """The ``shardkeeper status --json`` document."""
    return context_of(request).ops.status().to_dict()


@router.get("/jobs", summary="Every registered job")
def jobs(request: Request, _: Reader) -> JSON:
    """``{"jobs": [JobSummary...]}``."""
    return {"jobs": [s.to_dict() for s in context_of(request).ops.jobs()]}


@router.get("/jobs/{name}", summary="One job: config, leader, instances, a page of items")
def job(
    request: Request,
    name: str,
    _: Reader,
    offset: Annotated[int, Query(ge=0, description="The first item of the page.")] = 0,
    limit: Annotated[
        int, Query(ge=1, le=MAX_ITEM_PAGE, description="Items in the page.")
    ] = ITEM_PAGE,
) -> JSON:
    """The ``shardkeeper job NAME --json`` document with one page of ``items``
    (``items_offset``, ``items_limit``; ``items_total`` counts them all): a job of
    2,000 items answers 100 of them, not 900 KB."""
    document = context_of(request).ops.job(name).to_dict()
    items = document["items"]
    document["items"] = items[offset : offset + limit]
    document.update(items_total=len(items), items_offset=offset, items_limit=limit)
    return document


@router.get("/jobs/{name}/config", summary="The stored config document")
def get_config(request: Request, name: str, _: Reader) -> JSON:
    """The stored config (``config`` is null and ``error`` says why when invalid)."""
    stored = context_of(request).ops.stored_config(name)
    return {
        "config": config_to_dict(stored.config) if stored.config else None,
        "error": stored.error,
        "writer": stored.writer,
        "by": stored.by,
        "at": stored.at or None,
    }


@router.patch("/jobs/{name}/config", summary="Change fields of the stored config")
def patch_config(
    request: Request,
    name: str,
    who: Writer,
    changes: Annotated[JSON, Body(examples=[{"sharding_total_count": 8}])],
) -> JSONResponse:
    """Validated as a whole: 422 with ``errors`` (field -> message) when invalid."""
    ops = context_of(request).ops
    if not changes:
        raise ConfigError("nothing to change: give at least one field")
    errors = validate_changes(ops.job(name).config, changes)
    if errors:
        detail = "; ".join(f"{k}: {v}" for k, v in errors.items())
        return JSONResponse(
            {"detail": detail, "error": "JobConfigError", "errors": errors}, status_code=422
        )
    new = audited(request, who).update_config(name, **changes)
    return JSONResponse({"config": config_to_dict(new)})


@router.get("/jobs/{name}/history", summary="Recorded executions, newest first")
def history(
    request: Request,
    name: str,
    _: Reader,
    item: Annotated[str, Query(description="Only this item.")] = "",
    instance: Annotated[str, Query(description="Only runs on this instance.")] = "",
    failed: Annotated[bool, Query(description="Only failed/timed-out runs.")] = False,
    since: Annotated[str, Query(description="Only runs started since: 30s, 1h, 2d.")] = "",
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    execution: Annotated[str, Query(description="Every run of one execution id.")] = "",
) -> JSON:
    """``{"job": NAME, "executions": [...]}`` (the ``history --json`` rows)."""
    ctx = context_of(request)
    if ctx.history is None:
        raise ConfigError("history is off: start the console with --history-url")
    filters = {
        "item": item,
        "instance": instance,
        "failed": "1" if failed else "",
        "since": since,
        "limit": str(limit),
        "execution": execution,
    }
    entries = ctx.history.query(history_query(name, filters))
    return {"job": name, "executions": [e.to_dict() for e in entries]}


@router.get("/instances", summary="Live instances with their items per job")
def instances(request: Request, _: Reader, job: str | None = None) -> JSON:
    """``{"instances": [InstanceView...]}`` (of ``job`` only, when given)."""
    return {"instances": [v.to_dict() for v in context_of(request).ops.instances(job)]}


@router.post("/jobs/{name}/trigger", summary="Run the job's items now")
def trigger(request: Request, name: str, who: Writer, body: TriggerRequest | None = None) -> JSON:
    """``{"asked": [instance...]}``; 409 when the job is disabled or has no instance."""
    req = body or TriggerRequest()
    asked = audited(request, who).trigger(name, req.instance, req.params or None, req.items)
    return {"job": name, "asked": asked}


@router.post("/jobs/{name}/disable", summary="Switch the job off")
def disable_job(request: Request, name: str, who: Writer) -> JSON:
    """No instance starts its items until enabled (running items finish)."""
    audited(request, who).disable_job(name)
    return {"job": name, "enabled": False}


@router.post("/jobs/{name}/enable", summary="Switch the job on")
def enable_job(request: Request, name: str, who: Writer) -> JSON:
    """Removes the operator's switch (and a ``disabled`` in the stored config)."""
    audited(request, who).enable_job(name)
    return {"job": name, "enabled": True}


@router.delete("/jobs/{name}", summary="Remove a stopped job")
def remove_job(
    request: Request,
    name: str,
    who: Writer,
    force: Annotated[bool, Query(description="Even while instances run it.")] = False,
) -> JSON:
    """409 while live instances run it (unless ``force``: they keep running it)."""
    members = audited(request, who).remove_job(name, force=force)
    return {"job": name, "removed": True, "members": members}


@router.post("/jobs/{name}/items/{item}/disable", summary="Switch one item off")
def disable_item(request: Request, name: str, item: int, who: Writer) -> JSON:
    """Its owner skips it from the next trigger on."""
    audited(request, who).disable_item(name, item)
    return {"job": name, "item": item, "disabled": True}


@router.post("/jobs/{name}/items/{item}/enable", summary="Switch one item on")
def enable_item(request: Request, name: str, item: int, who: Writer) -> JSON:
    """The item runs again from the next trigger on."""
    audited(request, who).enable_item(name, item)
    return {"job": name, "item": item, "disabled": False}


@router.post("/instances/{instance}/disable", summary="Give an instance no items")
def disable_instance(
    request: Request, instance: str, who: Writer, body: InstanceSwitch | None = None
) -> JSON:
    """In ``job`` (or every job it runs); the leader moves its items."""
    jobs = audited(request, who).disable_instance(instance, (body or InstanceSwitch()).job)
    return {"instance": instance, "disabled": True, "jobs": jobs}


@router.post("/instances/{instance}/enable", summary="Let an instance take items again")
def enable_instance(
    request: Request, instance: str, who: Writer, body: InstanceSwitch | None = None
) -> JSON:
    """In ``job`` (or every job); returns the jobs switched."""
    jobs = audited(request, who).enable_instance(instance, (body or InstanceSwitch()).job)
    return {"instance": instance, "disabled": False, "jobs": jobs}


@router.post("/instances/{instance}/shutdown", summary="Stop an instance gracefully")
def shutdown(request: Request, instance: str, who: Writer) -> JSON:
    """The instance finishes its running items within its grace period and leaves."""
    audited(request, who).shutdown(instance)
    return {"instance": instance, "shutdown_requested": True}
