"""Entry points: the CLI, the worker process and the admin HTTP API."""
