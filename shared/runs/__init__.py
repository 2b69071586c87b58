"""Runs: the store (SQL), the pure admission decision, and the manager."""
