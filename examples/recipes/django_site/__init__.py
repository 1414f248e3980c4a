"""Recipe: a minimal Django project whose ``run_jobs`` command runs sharded jobs."""
