-- How events enter the transactional outbox (outbox_writer.py).

-- name: copy_outbox_events
COPY identity.outbox_events (event_id, topic, message_key, event_type, correlation_id, traceparent, value)
FROM STDIN;
