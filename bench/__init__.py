"""The benchmark harness behind ``make bench`` (``python -m bench``).

One module per benchmark (failover, resharding, coordination_cost, throughput,
jitter, scale), each with ``run(ctx, backend) -> dict``; ``report`` renders the
JSON results into docs/benchmarks.md and docs/img/*.png. See docs/benchmarks.md.
"""
