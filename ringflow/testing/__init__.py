"""Helpers for tests and validation runs: network namespaces for multi-host setups, the in-rank self-test matrix."""
