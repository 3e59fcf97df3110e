"""Logs, metrics and traces with the names of CONTRACTS section 4a."""
