"""Where items run: the worker pool, one attempt, and the process executor (its
pool, wire, child side and fork guard)."""
