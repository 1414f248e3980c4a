"""The job configuration kept in the registry (``/jobs/{job}/config``): one document,
two kinds of writers, one policy.

The document is the JobConfig's JSON plus a ``_meta`` object saying who wrote it::

    {..., "_meta": {"writer": "operator", "by": "shardkeeper-ops@laptop", "at": 1.7e9,
                    "revision": 4, "edits": {"cron": {"code": "0 * * * *"}}}}

``writer`` is ``instance`` (an instance registering the job from its code) or
``operator`` (``shardkeeper config set/replace``, the operations API). ``edits`` names
the fields an operator changed and, when known, the value the code's config had
for that field when the operator changed it (``{}`` when unknown: the stored
document was corrupt or predates this format). ``revision`` counts writes.

The policy (see docs/configuration.md, "Who writes the stored config"):

* The first instance creates the document. Later instances use the stored config,
  unless their config says ``overwrite``.
* ``overwrite=True`` replaces what an instance wrote, and a corrupt document (with a
  WARNING naming what was wrong). It never undoes an operator's edit that is newer
  than the code's config: a field the operator changed is kept (WARNING naming it)
  unless the code's value of that field changed since the edit (a new deployment
  that changed it is newer, and wins; WARNING too).
* A job name registered by another job class is refused: two programs sharing one
  job's items would corrupt each other.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardkeeper.config import JobConfig
from shardkeeper.config.secrets import mask_value, restore_masked
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.sharding import necessary_value
from shardkeeper.errors import JobConfigError, JobConflictError, OperationRefusedError
from shardkeeper.registry.base import Check, CoordinationStore, Op, Put

__all__ = [
    "META_KEY",
    "ConfigService",
    "StoredConfig",
    "decode_document",
    "encode_document",
    "instance_writer",
]

log = logging.getLogger(__name__)

META_KEY = "_meta"
"""The key of the writer metadata inside the stored document."""

INSTANCE, OPERATOR = "instance", "operator"

# Fields that are never an operator's edit: identity, and the start-up switch itself.
_UNTRACKED = frozenset({"name", "job_class", "overwrite"})
_ATTEMPTS = 5


def _host() -> str:
    return socket.gethostname().split(".")[0] or "host"


def instance_writer() -> str:
    """How an instance names itself as the writer of a config: ``host@pid``."""
    return f"{_host()}@{os.getpid()}"


def _json_value(value: Any) -> Any:
    """A field value as plain JSON data, for comparing and storing."""
    return json.loads(json.dumps(value, default=str, sort_keys=True))


def _class_name(import_path: str) -> str:
    """The class name of ``package.module:Class`` or ``package.module.Class``."""
    return import_path.replace(":", ".").rsplit(".", 1)[-1]


def _fields(config: JobConfig) -> dict[str, Any]:
    # the JSON-mode dump is what to_json() encodes: no encode and decode round trip
    data: dict[str, Any] = config.model_dump(mode="json")
    return data


@dataclass(frozen=True)
class StoredConfig:
    """What the config node holds, decoded without ever raising: ``config`` is None
    and ``error`` says why when the document is invalid."""

    raw: bytes
    version: int
    config: JobConfig | None
    error: str | None = None
    writer: str = "unknown"
    by: str = ""
    at: float = 0.0
    revision: int = 0
    #: field -> {"code": value the code had when the operator changed it} or {}
    edits: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The raw document as text (undecodable bytes replaced)."""
        return self.raw.decode("utf-8", errors="replace")

    def data(self) -> dict[str, Any]:
        """The stored fields as far as they can be read (corrupt: the JSON object's
        fields without the metadata, or nothing)."""
        if self.config is not None:
            return _fields(self.config)
        try:
            obj = json.loads(self.raw)
        except (ValueError, UnicodeDecodeError):
            return {}
        if not isinstance(obj, dict):
            return {}
        return {k: v for k, v in obj.items() if k != META_KEY}


def encode_document(
    config: JobConfig,
    *,
    writer: str,
    by: str,
    revision: int,
    edits: Mapping[str, Mapping[str, Any]] | None = None,
) -> bytes:
    """The stored document: the config's canonical JSON plus the writer metadata."""
    doc = _fields(config)
    doc[META_KEY] = {
        "writer": writer,
        "by": by,
        "at": round(time.time(), 3),
        "revision": revision,
        "edits": {k: dict(v) for k, v in sorted((edits or {}).items())},
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def decode_document(raw: bytes, version: int = -1, path: str = "?") -> StoredConfig:
    """Decode a stored document; never raises (see :class:`StoredConfig`)."""
    meta: dict[str, Any] = {}
    try:
        obj = json.loads(raw)
        if isinstance(obj, dict) and isinstance(obj.get(META_KEY), dict):
            meta = obj[META_KEY]
    except (ValueError, UnicodeDecodeError):
        pass
    edits_raw = meta.get("edits")
    edits = (
        {str(k): dict(v) for k, v in edits_raw.items() if isinstance(v, dict)}
        if isinstance(edits_raw, dict)
        else {}
    )
    try:
        revision = int(meta.get("revision", 0))
        at = float(meta.get("at", 0.0))
    except (TypeError, ValueError):
        revision, at = 0, 0.0
    common: dict[str, Any] = {
        "raw": raw,
        "version": version,
        "writer": str(meta.get("writer", "unknown")),
        "by": str(meta.get("by", "")),
        "at": at,
        "revision": revision,
        "edits": edits,
    }
    try:
        return StoredConfig(config=JobConfig.from_json(raw), **common)
    except JobConfigError as exc:
        return StoredConfig(
            config=None, error=f"stored config at {path} is invalid: {exc}", **common
        )


class ConfigService:
    """Reads and writes one job's stored configuration (see module docstring)."""

    def __init__(self, store: CoordinationStore, paths: JobPaths) -> None:
        self._store = store
        self._paths = paths

    # -- reading ----------------------------------------------------------------------

    def read(self) -> StoredConfig | None:
        """The stored document, decoded without raising; None when absent."""
        node = self._store.get(self._paths.config)
        if node is None or not node.value:
            return None
        return decode_document(node.value, node.version, self._paths.config)

    def load(self) -> JobConfig | None:
        """The stored config, or None when absent. JobConfigError if it is invalid."""
        stored = self.read()
        if stored is None:
            return None
        if stored.config is None:
            raise JobConfigError(f"{stored.error}{self._repair_hint()}")
        return stored.config

    def _repair_hint(self) -> str:
        job = self._paths.job
        return (
            f" (repair it: shardkeeper config set {job} KEY=VALUE..., shardkeeper config "
            f"replace {job} --file FILE, or start an instance with overwrite=True)"
        )

    # -- instances --------------------------------------------------------------------

    @staticmethod
    def initial_document(config: JobConfig, by: str | None = None) -> bytes:
        """The document an instance creates for a job that is not stored yet (what
        :meth:`sync` creates; a batched registration creates it in its own commit).
        ``by`` names the writer (default: :func:`instance_writer`)."""
        return encode_document(config, writer=INSTANCE, by=by or instance_writer(), revision=1)

    def sync(self, config: JobConfig) -> tuple[JobConfig, bool]:
        """Register ``config``: create it if absent, refuse a different job class, and
        with ``config.overwrite`` replace an instance's config or a corrupt one while
        keeping an operator's newer edits. Returns (effective config, whether the
        sharding total count changed against what was stored)."""
        by = instance_writer()
        for _ in range(_ATTEMPTS):
            doc = self.initial_document(config, by)
            if self._store.create(self._paths.config, doc) is not None:
                return config, False
            stored = self.read()
            if stored is None:
                continue  # removed in between: create again
            result = self._sync_with(config, stored, by)
            if result is not None:
                return result
        raise OperationRefusedError(
            f"the stored config of job {config.name!r} kept changing while this instance "
            f"registered ({_ATTEMPTS} attempts)"
        )

    def _sync_with(
        self, config: JobConfig, stored: StoredConfig, by: str
    ) -> tuple[JobConfig, bool] | None:
        """One attempt of :meth:`sync` against what was read; None when the document
        changed before the write."""
        current = stored.config
        if current is None:
            if not config.overwrite:
                raise JobConfigError(f"{stored.error}{self._repair_hint()}")
            log.warning(
                "%s: %s; replacing it with this instance's config (overwrite=True)",
                config.name,
                stored.error,
            )
            doc = encode_document(config, writer=INSTANCE, by=by, revision=stored.revision + 1)
            if not self._write(doc, stored.version):
                return None
            return config, True
        if current.job_class and config.job_class and current.job_class != config.job_class:
            if _class_name(current.job_class) == _class_name(config.job_class):
                # The same class moved to another module: during a rolling deploy old
                # and new instances run side by side, so this must not block either.
                log.info(
                    "%s: job class %s is now at %s (same class name: accepted)",
                    config.name,
                    current.job_class,
                    config.job_class,
                )
            else:
                raise JobConflictError(
                    f"job {config.name!r} is already registered by {current.job_class!r}; "
                    f"refusing to run it as {config.job_class!r} (choose another job name, "
                    "or remove the job first; a class that only moved module keeps its name)"
                )
        if not config.overwrite:
            self._warn_ignored(config, current)
            return current, False
        merged, edits = self._merge(config, stored)
        writer = OPERATOR if edits else INSTANCE
        if merged == current and edits == stored.edits and writer == stored.writer:
            return current, False
        doc = encode_document(
            merged, writer=writer, by=by, revision=stored.revision + 1, edits=edits
        )
        if not self._write(doc, stored.version):
            return None
        if merged != current:
            log.info("%s: stored config overwritten (overwrite=True)", config.name)
        return merged, current.sharding_total_count != merged.sharding_total_count

    def _warn_ignored(self, config: JobConfig, current: JobConfig) -> None:
        """Say so when this instance's config (its code or job file) differs from the
        stored one, which wins without ``overwrite``: a silently ignored edit of a job
        file looks like a bug."""
        mine, stored = _fields(config), _fields(current)
        # job_class is checked above; overwrite is this instance's own switch
        differ = sorted(
            k for k in mine if k not in ("job_class", "overwrite") and mine[k] != stored.get(k)
        )
        if differ:
            log.warning(
                "%s: the stored config is used; this instance's differs in %s and is "
                "ignored (the registry's copy wins once a job is stored: set overwrite=True "
                "to replace it at start, or change it with `shardkeeper config set|replace`)",
                config.name,
                ", ".join(differ),
            )

    def _merge(
        self, config: JobConfig, stored: StoredConfig
    ) -> tuple[JobConfig, dict[str, dict[str, Any]]]:
        """The config an ``overwrite`` start writes, and the operator edits still in
        force (each with the code's value now, so that a later change of the code's
        value can be told from this one)."""
        assert stored.config is not None
        if stored.writer != OPERATOR or not stored.edits:
            return config, {}
        code, kept_data = _fields(config), _fields(stored.config)
        merged = dict(code)
        kept: dict[str, dict[str, Any]] = {}
        replaced: list[str] = []
        for name, base in sorted(stored.edits.items()):
            if name in _UNTRACKED or name not in code:
                continue
            code_changed = "code" in base and _json_value(base["code"]) != code[name]
            if code_changed:
                replaced.append(name)
                continue
            merged[name] = kept_data.get(name)
            if merged[name] != code[name]:
                kept[name] = {"code": code[name]}
        try:
            result = JobConfig.parse(**merged)
        except JobConfigError as exc:
            log.warning(
                "%s: the operator's edits of %s cannot be combined with this instance's "
                "config (%s); this instance's config replaces them (overwrite=True)",
                config.name,
                ", ".join(sorted(kept)),
                exc,
            )
            return config, {}
        if kept:
            log.warning(
                "%s: overwrite=True kept the operator's edits of %s (by %s, newer than this "
                "instance's config: %s); change them with `shardkeeper config set`",
                config.name,
                ", ".join(kept),
                stored.by or "an operator",
                ", ".join(f"{k}={json.dumps(mask_value(k, merged[k]))}" for k in kept),
            )
        if replaced:
            log.warning(
                "%s: overwrite=True replaced the operator's edits of %s: this instance's "
                "config changed them since (%s)",
                config.name,
                ", ".join(replaced),
                ", ".join(f"{k}={json.dumps(mask_value(k, code[k]))}" for k in replaced),
            )
        return result, kept

    def _write(self, doc: bytes, version: int, extra: list[Op] | None = None) -> bool:
        ops: list[Op] = [Check(self._paths.config, version=version), Put(self._paths.config, doc)]
        return bool(self._store.commit(ops + (extra or [])))

    # -- operators --------------------------------------------------------------------

    def update(self, changes: Mapping[str, Any], *, by: str) -> tuple[JobConfig, JobConfig | None]:
        """An operator's edit of some fields, validated as a whole. Works on a corrupt
        document too: its readable fields are the base. A new sharding total count
        sets the reshard flag in the same commit. Returns (new, old config or None
        when the stored one was corrupt). JobConfigError when the result is invalid
        or nothing is stored."""
        return self._operator_write(lambda data: {**data, **changes}, by)

    def replace(self, config: JobConfig, *, by: str) -> tuple[JobConfig, JobConfig | None]:
        """An operator's replacement of the whole document (also of a corrupt one).
        The job class is kept when the new config names none."""

        def build(data: dict[str, Any]) -> dict[str, Any]:
            new = _fields(config)
            if new.get("job_class") is None and data.get("job_class") is not None:
                new["job_class"] = data["job_class"]
            return new

        return self._operator_write(build, by)

    def save(self, config: JobConfig) -> None:
        """Replace the stored config as an operator (operations API)."""
        self.replace(config, by=f"shardkeeper-ops@{_host()}")

    def _operator_write(
        self, build: Callable[[dict[str, Any]], dict[str, Any]], by: str
    ) -> tuple[JobConfig, JobConfig | None]:
        job = self._paths.job
        for _ in range(_ATTEMPTS):
            stored = self.read()
            if stored is None:
                raise JobConfigError(f"job {job!r} has no stored config")
            base = stored.data()
            # a secret sent back as a view showed it (masked) keeps the stored secret
            data = restore_masked(base, build({**base, "name": job}))
            if data.get("name") != job:
                raise JobConfigError(
                    f"the name of job {job!r} cannot change (got {data.get('name')!r}); "
                    "register a new job and remove this one instead"
                )
            new = JobConfig.parse(**{k: v for k, v in data.items() if k != META_KEY})
            old = stored.config
            if old is not None and new == old:
                return old, old
            edits = self._operator_edits(stored, new)
            doc = encode_document(
                new, writer=OPERATOR, by=by, revision=stored.revision + 1, edits=edits
            )
            extra: list[Op] = []
            if old is None or new.sharding_total_count != old.sharding_total_count:
                before = old.sharding_total_count if old is not None else "?"
                reason = f"count changed: {before} -> {new.sharding_total_count}"
                extra.append(Put(self._paths.necessary, necessary_value(reason)))
            if self._write(doc, stored.version, extra):
                return new, old
        raise OperationRefusedError(
            f"the config of job {job!r} kept changing under this edit ({_ATTEMPTS} "
            "attempts); try again"
        )

    @staticmethod
    def _operator_edits(stored: StoredConfig, new: JobConfig) -> dict[str, dict[str, Any]]:
        """The edits in force after an operator writes ``new`` over ``stored``: earlier
        edits keep the code's value they recorded; a newly changed field records the
        stored value (the code's, unless an operator had changed it); a field set back
        to the code's value is no edit any more. Over a corrupt document the code's
        values are unknown."""
        old = _fields(stored.config) if stored.config is not None else None
        earlier = stored.edits if stored.writer == OPERATOR else {}
        edits: dict[str, dict[str, Any]] = {}
        for name, value in _fields(new).items():
            if name in _UNTRACKED:
                continue
            if name in earlier:
                base = earlier[name]
            elif old is None:
                base = {}
            elif old.get(name) != value:
                base = {"code": old.get(name)}
            else:
                continue
            if "code" in base and _json_value(base["code"]) == value:
                continue  # back to the code's value
            edits[name] = dict(base)
        return edits
