"""Tests of the demo (python -m shardkeeper.demo)."""
