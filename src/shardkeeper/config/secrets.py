"""The secret-valued fields of a job configuration: which they are, how a view masks
them, and how a masked value written back keeps the secret.

``alert_webhook_url`` is the one secret field (a Slack-style webhook URL carries its
token in the path). It takes a literal URL or an ``env:NAME`` / ``file:PATH``
reference (:mod:`shardkeeper.secretref`), stored as written and resolved by the
instance that sends the alert.

Every view of a stored config (the CLI, the console and its REST API, the ops views)
shows it through :func:`mask_config_data`: a literal as ``https://host/***``, a
reference as is. An edit that sends such a masked value back (a form saved as it was
shown, ``config get --json`` edited and replaced, ``config set
alert_webhook_url=https://host/***``) keeps the stored secret: :func:`restore_masked`
puts it back when the mask is the stored value's own, and refuses any other masked
value, so a mask is never written over a secret.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from shardkeeper.errors import JobConfigError
from shardkeeper.secretref import MASK, is_masked, mask_urls_in_text, mask_webhook_url

__all__ = [
    "META_KEY",
    "SECRET_FIELDS",
    "mask_config_data",
    "mask_config_text",
    "mask_edits",
    "mask_value",
    "restore_masked",
]

SECRET_FIELDS: Mapping[str, Callable[[str], str]] = {"alert_webhook_url": mask_webhook_url}
"""Each secret-valued field of :class:`~shardkeeper.config.JobConfig` and its mask."""

META_KEY = "_meta"
"""The writer metadata of the stored document (its ``edits`` keep the code's value
of each field an operator changed: a secret field's too)."""


def mask_value(field: str, value: Any) -> Any:
    """``value`` of ``field`` as a view shows it (masked when ``field`` is secret)."""
    mask = SECRET_FIELDS.get(field)
    if mask is None or not isinstance(value, str):
        return value
    return mask(value)


def mask_config_data(data: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of config ``data`` (its JSON form, or a stored document with ``_meta``)
    with every secret field masked."""
    out = {k: mask_value(k, v) for k, v in data.items()}
    meta = out.get(META_KEY)
    if isinstance(meta, Mapping) and isinstance(meta.get("edits"), Mapping):
        out[META_KEY] = {**meta, "edits": mask_edits(meta["edits"])}
    return out


def mask_edits(edits: Mapping[str, Any]) -> dict[str, Any]:
    """The operator edits of a stored document (field -> ``{"code": value}``) with
    the code's value of each secret field masked."""
    return {
        name: (
            {k: mask_value(name, v) for k, v in edit.items()} if isinstance(edit, Mapping) else edit
        )
        for name, edit in edits.items()
    }


def mask_config_text(text: str) -> str:
    """A stored config document's text with its secrets masked: as JSON when it is a
    JSON object, else (a corrupt document) with every http(s) URL in it masked."""
    try:
        obj = json.loads(text)
    except ValueError:
        return mask_urls_in_text(text)
    if not isinstance(obj, dict):
        return mask_urls_in_text(text)
    masked = mask_config_data(obj)
    if masked == obj:
        return text  # nothing secret: the document exactly as stored
    # the operator repairs the text shown: keep its layout where the secrets can be
    # replaced in place, else show it re-encoded
    shown = text
    for field, value in _secret_values(obj):
        shown = shown.replace(value, mask_value(field, value))
    try:
        if json.loads(shown) == masked:
            return shown
    except ValueError:
        pass
    return json.dumps(masked, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _secret_values(obj: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, value) of every literal secret in a stored document, longest first."""
    found = [(k, v) for k, v in obj.items() if k in SECRET_FIELDS and isinstance(v, str)]
    meta = obj.get(META_KEY)
    edits = meta.get("edits") if isinstance(meta, Mapping) else None
    if isinstance(edits, Mapping):
        for name, edit in edits.items():
            if name in SECRET_FIELDS and isinstance(edit, Mapping):
                found += [(name, v) for v in edit.values() if isinstance(v, str)]
    return sorted(found, key=lambda pair: -len(pair[1]))


def restore_masked(current: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``new`` config data with each secret field that holds the mask of its value in
    ``current`` given that value back (the operator kept it as shown).

    JobConfigError for a secret field holding any other masked value: it was read
    from a view of another secret (or changed by hand around the mask), and writing
    it would replace a secret with a mask.
    """
    out = dict(new)
    for field, mask in SECRET_FIELDS.items():
        value = out.get(field)
        if not is_masked(value):
            continue
        stored = current.get(field)
        if isinstance(stored, str) and mask(stored) == value:
            out[field] = stored
            continue
        raise JobConfigError(
            f"{field}: {value!r} is a masked value (it holds {MASK!r}, as every view shows a "
            "secret), not the secret itself, and it is not the mask of the stored value; "
            "give the secret, or a reference to it: env:NAME or file:PATH"
        )
    return out
