"""Use cases of the identity context: each one transaction that also writes its events to the outbox."""
