"""Tests of the examples in examples/."""
