"""Kafka adapter: producer, topics, embedded broker."""
