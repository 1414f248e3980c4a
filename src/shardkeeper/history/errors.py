"""The error a history read raises when the database cannot answer."""

from __future__ import annotations

from shardkeeper.errors import ShardkeeperError

__all__ = ["HistoryUnavailableError"]


class HistoryUnavailableError(ShardkeeperError):
    """The history database could not be read (unreachable, refused, not a database).
    The message names the database (password hidden) and the driver's reason."""
