"""Tests of the demo (python -m demo)."""
