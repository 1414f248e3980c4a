"""Unit tests: pure building blocks, no coordination store needed."""
