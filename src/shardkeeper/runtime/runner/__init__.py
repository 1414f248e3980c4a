"""One job on this instance: the runner that wires its parts and executes their
commands, and the duties it runs (repair passes, the stored settings, one-off jobs,
run-now requests)."""
