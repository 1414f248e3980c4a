"""Coordination services: membership, election, sharding, execution marks, failover."""
