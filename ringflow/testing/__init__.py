"""Helpers for tests and validation runs that need real multi-host setups."""
