"""The pages' forms: every steering operation, for operators, CSRF-checked.

Each action redirects back (303) with a message saying what was done, or why it
was refused; a config edit with invalid values, or one the registry refuses, shows
the job page again with a notice on top naming each bad value and why, each error
next to its field and the typed values kept. Every write is made through
:func:`~shardkeeper.console.audit.audited`: it is recorded in the audit trail under
the logged-in user's name (a warning joins the message if it could not be).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from shardkeeper.console.audit import audited, warning_suffix
from shardkeeper.console.context import context_of
from shardkeeper.console.deps import OperatorForm, operator_form
from shardkeeper.console.forms import EDITABLE, form_changes, parse_params, validate_changes
from shardkeeper.console.pages import job_page
from shardkeeper.console.render import redirect
from shardkeeper.errors import JobConfigError, JobLookupError, ShardkeeperError

__all__ = ["router"]

router = APIRouter(include_in_schema=False)
Form = Annotated[OperatorForm, Depends(operator_form)]


def _job_url(name: str) -> str:
    return f"/jobs/{quote(name, safe='')}"


def _back(form: OperatorForm, default: str) -> str:
    back = form.text("back")
    return back if back.startswith("/") and not back.startswith("//") else default


def _act(request: Request, back: str, action: Callable[[], str]) -> Response:
    """Run ``action`` (which returns the success message); redirect to ``back``."""
    try:
        message = action()
    except ShardkeeperError as exc:
        return redirect(request, back, f"refused: {exc}{warning_suffix(request)}", error=True)
    return redirect(request, back, message + warning_suffix(request))


@router.post("/jobs/{name}/trigger")
def trigger(request: Request, name: str, form: Form) -> Response:
    """Run the job's items now (optionally on one instance, with one-off params)."""
    ops = audited(request, form.principal)

    def act() -> str:
        params = parse_params(form.text("params"))
        asked = ops.trigger(name, form.text("instance") or None, params or None)
        extra = f" with {len(params)} parameter(s)" if params else ""
        return f"triggered {name}{extra} on {', '.join(asked)}"

    return _act(request, _job_url(name), act)


@router.post("/jobs/{name}/config")
def edit_config(request: Request, name: str, form: Form) -> Response:
    """Change the fields whose text changed; invalid values are shown by their field."""
    ops = audited(request, form.principal)
    data = ops.ops.job(name).config
    submitted = {k: form.text(k) for k in EDITABLE if k in form.form}
    try:
        changes = form_changes(data, submitted)
    except ShardkeeperError as exc:
        changes, errors = {}, {"_config": str(exc)}
    else:
        errors = validate_changes(data, changes) if changes else {}
    if not errors and not changes:
        return redirect(request, _job_url(name), "nothing changed")
    status = 422
    if not errors:
        try:
            ops.update_config(name, **changes)
        except JobConfigError as exc:
            errors = {"_config": str(exc)}
        except JobLookupError:
            raise  # removed meanwhile: no job page to show again
        except ShardkeeperError as exc:
            # refused by the registry (permission, store down, concurrent edits): the
            # page comes back with the notice on top and what was typed kept
            from shardkeeper.console.app import status_of  # app imports this module

            status = status_of(exc)
            refused = context_of(request).scrub(str(exc))
            errors = {"_config": f"the registry refused the write: {refused}"}
        else:
            changed = f"config of {name} changed: {', '.join(sorted(changes))}"
            return redirect(request, _job_url(name), changed + warning_suffix(request))
    return job_page(
        request, form.principal, name, submitted=submitted, errors=errors, status_code=status
    )


@router.post("/jobs/{name}/{switch}")
def switch_job(request: Request, name: str, switch: str, form: Form) -> Response:
    """``disable``/``enable`` the job, or ``remove`` it (refused while it runs)."""
    ops = audited(request, form.principal)

    def act() -> str:
        if switch == "disable":
            ops.disable_job(name)
            return f"job {name} disabled"
        if switch == "enable":
            ops.enable_job(name)
            return f"job {name} enabled"
        ops.remove_job(name)
        return f"job {name} removed"

    if switch not in ("disable", "enable", "remove"):
        return redirect(request, _job_url(name), f"unknown action {switch!r}", error=True)
    if switch == "remove":  # a removed job has no page to go back to
        try:
            message = act()
        except ShardkeeperError as exc:
            refused = f"refused: {exc}{warning_suffix(request)}"
            return redirect(request, _job_url(name), refused, error=True)
        return redirect(request, "/", message + warning_suffix(request))
    return _act(request, _job_url(name), act)


@router.post("/jobs/{name}/items/{item}/{switch}")
def switch_item(request: Request, name: str, item: int, switch: str, form: Form) -> Response:
    """``disable``/``enable`` one item."""
    ops = audited(request, form.principal)

    def act() -> str:
        if switch == "disable":
            ops.disable_item(name, item)
            return f"item {item} of {name} disabled"
        ops.enable_item(name, item)
        return f"item {item} of {name} enabled"

    if switch not in ("disable", "enable"):
        return redirect(request, _job_url(name), f"unknown action {switch!r}", error=True)
    return _act(request, _job_url(name), act)


@router.post("/instances/{instance}/{switch}")
def switch_instance(request: Request, instance: str, switch: str, form: Form) -> Response:
    """``disable``/``enable`` an instance (in one job, or all), or ``shutdown`` it."""
    ops = audited(request, form.principal)
    job = form.text("job") or None

    def act() -> str:
        if switch == "shutdown":
            ops.shutdown(instance)
            return f"asked {instance} to shut down"
        if switch == "disable":
            jobs = ops.disable_instance(instance, job)
        else:
            jobs = ops.enable_instance(instance, job)
        return f"instance {instance} {switch}d in {', '.join(jobs) or 'no job'}"

    if switch not in ("disable", "enable", "shutdown"):
        return redirect(request, "/instances", f"unknown action {switch!r}", error=True)
    return _act(request, _back(form, "/instances"), act)
