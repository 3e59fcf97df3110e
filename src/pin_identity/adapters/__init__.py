"""Adapters: PostgreSQL, Kafka and the Talent HTTP API."""
