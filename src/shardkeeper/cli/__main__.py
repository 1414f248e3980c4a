"""``python -m shardkeeper.cli``: the same as the ``shardkeeper`` command."""

from __future__ import annotations

import sys

from shardkeeper.cli import main

sys.exit(main())
