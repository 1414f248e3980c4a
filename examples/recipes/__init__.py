"""Recipes: shardkeeper inside FastAPI, gunicorn and Django (see docs/deployment.md)."""
