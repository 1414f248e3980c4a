"""Runnable examples of shardkeeper jobs (see docs/getting-started.md).

A package so that ``shardkeeper run examples.simple_job:CityReport`` can import them
from the repository root.
"""
