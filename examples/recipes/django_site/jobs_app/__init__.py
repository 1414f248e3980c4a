"""The Django app of the recipe: it only ships the ``run_jobs`` management command."""
