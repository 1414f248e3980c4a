"""Changing what is stored for a job (:class:`Writes`): the job and item switches,
config edits and replacement, and removal of the job."""

from __future__ import annotations

import json
import time
from typing import Any

from shardkeeper.config import JobConfig
from shardkeeper.config.secrets import mask_config_data
from shardkeeper.coordination.config_service import ConfigService
from shardkeeper.coordination.paths import JobPaths, checkpoint_job_root
from shardkeeper.errors import ConfigError, JobLookupError, OperationRefusedError, StoreError
from shardkeeper.ops.base import OperationsBase, operator, stamp, valid_job_name
from shardkeeper.registry.base import Check, Put

#: how long a forced removal waits for the instances that ran the job to retire it
#: (each does within a lane task of seeing the config deleted), and keeps walking
#: the job's subtree again while one of them still writes
_REMOVE_PATIENCE = 15.0

__all__ = ["Writes", "config_to_dict"]


class Writes(OperationsBase):
    """Job and item switches, configuration and removal."""

    def disable_job(self, job: str) -> None:
        """Switch the whole job off: no instance starts its items until enabled
        (running items finish)."""
        paths = self._require_job(job)
        self._switch_off(paths.disabled_job, "disable job")

    def enable_job(self, job: str) -> None:
        """Switch the job on again: removes the operator switch and, when the stored
        config says ``disabled``, clears that too (so the job really runs)."""
        paths = self._require_job(job)
        self.store.delete(paths.disabled_job, recursive=False)
        # No parse needed for the switch: a corrupt config does not block it (the
        # config's own flag can only be read, and cleared, once it is valid).
        stored = ConfigService(self.store, paths).read()
        if stored is not None and stored.config is not None and stored.config.disabled:
            self.update_config(job, disabled=False)

    def disable_item(self, job: str, item: int) -> None:
        """Switch one item off: its owner skips it from the next trigger on."""
        state = self._job_state(job)
        self._check_item(state, item)
        self._switch_off(JobPaths(job).disabled_item(item), "disable item")

    def _switch_off(self, path: str, action: str) -> None:
        """Write an operator's switch with the time it took effect (``"at"``): the
        instances skip the fires due from then on and still decide the earlier ones
        (a fire delayed past the disable by a reshard wait or a busy item).

        The time is the store's where it gives one: on ZooKeeper the switch is
        written again unchanged and the ``mtime`` of that write (the ZooKeeper
        leader's clock, just after the switch existed) replaces the writer's
        clock; the instances' clocks are held to the store's by
        ``max_time_diff_seconds``, this host's is not. etcd tells no time: there
        (and if the second write fails) the writer's clock stands
        (``"clock": "writer"``)."""
        value = stamp(action, clock="writer")
        self.store.put(path, value)
        server_time = getattr(self.store, "server_time", None)
        if not callable(server_time):
            return
        try:
            stamped = server_time(path, value)
        except StoreError:
            return  # the switch is set; its time is the writer's clock
        if stamped is not None:
            # only onto the switch still set: an enable meanwhile is not undone
            self.store.commit(
                [
                    Check(path, exists=True),
                    Put(path, stamp(action, at=round(stamped.seconds, 3), clock=stamped.source)),
                ]
            )

    def enable_item(self, job: str, item: int) -> None:
        """Switch one item on again. A leftover switch of an item beyond the current
        count may be removed too."""
        state = self._job_state(job)
        if item not in state.disabled_items:
            self._check_item(state, item)
        self.store.delete(JobPaths(job).disabled_item(item), recursive=False)

    def update_config(self, job: str, **changes: Any) -> JobConfig:
        """Change fields of the stored config, validated as a whole by JobConfig
        (JobConfigError naming the field). The name cannot change. A new
        ``sharding_total_count`` also sets the reshard flag. Returns the new config.
        Concurrent edits are detected (version check) and retried. On a corrupt
        stored config its readable fields are the base, so an edit can repair it.
        The document records the edit as an operator's (see docs/configuration.md:
        an instance's ``overwrite`` does not undo it)."""
        return self.edit_config(job, changes)[0]

    def edit_config(
        self, job: str, changes: dict[str, Any], *, by: str | None = None
    ) -> tuple[JobConfig, JobConfig | None]:
        """:meth:`update_config` that also returns the config it changed (None when
        the stored one was corrupt), for an audit entry's before and after; ``by``
        names the operator in the stored document (default: this process's)."""
        if "name" in changes and changes["name"] != job:
            raise ConfigError(
                f"the name of job {job!r} cannot change; register a new job and remove "
                "this one instead"
            )
        if not changes:
            raise ConfigError("nothing to change")
        paths = self._require_job(job)
        return ConfigService(self.store, paths).update(changes, by=by or operator())

    def replace_config(
        self, job: str, config: JobConfig, *, by: str | None = None
    ) -> tuple[JobConfig, JobConfig | None]:
        """Replace the whole stored config of ``job`` with ``config`` (its name must be
        ``job``), also when the stored one is corrupt: the repair for a config no
        edit can fix. Sets the reshard flag when the count changes (or the old count
        is unreadable). Returns (new, old config or None when it was corrupt). ``by``
        names the operator in the stored document (default: this process's)."""
        if config.name != job:
            raise ConfigError(
                f"the config is for job {config.name!r}, not {job!r}; the name of a job "
                "cannot change"
            )
        paths = self._require_job(job)
        return ConfigService(self.store, paths).replace(config, by=by or operator())

    def remove_job(self, job: str, *, force: bool = False) -> list[str]:
        """Delete everything stored for ``job``: ``/jobs/{job}`` and its items'
        checkpoints (``/checkpoints/{job}``). Refused (OperationRefusedError) while
        live instances run it, unless ``force``; returns the instances that were
        still members. Forced, the instances that run it see its config deleted
        and stop running it (the rest of each instance goes on)."""
        paths = self._removable(job)
        members = self.store.children(paths.instances)
        if members and not force:
            raise OperationRefusedError(
                f"job {job!r} is run by {len(members)} live instance(s) "
                f"({', '.join(members)}); stop them first or use force"
            )
        # the checkpoints first: left behind, a new job of the same name with
        # checkpoint_carry would get them as its first runs' ctx.last_state
        self.store.delete(checkpoint_job_root(job), recursive=True)
        # then the config: live instances see it go and retire the job (they leave
        # its membership and leadership); a failure after this point is finished by
        # a second `remove` (it looks for the job's root, not its config)
        self.store.delete(paths.config, recursive=False)
        deadline = time.monotonic() + _REMOVE_PATIENCE
        # Wait for them to leave before deleting the rest: deleting a member's node
        # first would make it register again (and elect a leader) while the subtree
        # goes. One that does not leave in time (an old version, a frozen process)
        # is deleted anyway.
        while self.store.children(paths.instances) and time.monotonic() < deadline:
            time.sleep(0.05)
        while True:
            try:
                self.store.delete(paths.root, recursive=True)
                return members
            except StoreError:
                # instances still retiring wrote a node while the subtree was
                # walked: they stop soon, so walk again until the deadline
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def _removable(self, job: str) -> JobPaths:
        """The job's paths when it has a config, or when only its root is left (a
        removal interrupted after the config was deleted); else JobLookupError."""
        try:
            return self._require_job(job)
        except JobLookupError:
            paths = JobPaths(job)
            if valid_job_name(job) and self.store.exists(paths.root):
                return paths
            raise


def config_to_dict(config: JobConfig, *, reveal: bool = False) -> dict[str, Any]:
    """A config as JSON data as stored (what ``config get --json`` prints), with its
    literal secrets masked (``https://host/***``; a reference is shown as is) unless
    ``reveal``: it is made to be shown. A masked value written back keeps the secret
    (:func:`shardkeeper.config.secrets.restore_masked`)."""
    data: dict[str, Any] = json.loads(config.to_json())
    return data if reveal else mask_config_data(data)
