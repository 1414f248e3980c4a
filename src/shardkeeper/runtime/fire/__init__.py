"""One fire: from the scheduler's callback to its last completion (the fire queue,
deciding a fire, running its batches, checkpoints, skipped fires)."""
