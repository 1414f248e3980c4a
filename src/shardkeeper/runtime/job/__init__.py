"""A job's state and vocabulary: its phase, its local state, the services it uses,
the ports its parts ask of the runner, registry events and the reactions to them,
the leader's duties and the fire schedule with what a run covers."""
