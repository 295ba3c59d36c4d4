-- Transactional outbox: an event describing work is written in the same transaction as the rows
-- that create the work; a relay publishes it to RabbitMQ with publisher confirms and marks it
-- published. The write path never waits for the broker, and no event is lost when it is down.
CREATE TABLE outbox_events (
    id             bigserial   PRIMARY KEY,
    message_id     uuid        NOT NULL UNIQUE,
    routing_key    text        NOT NULL,
    type_name      text        NOT NULL,
    payload        bytea       NOT NULL,
    -- W3C trace context of the writing request, so one trace spans gRPC -> AMQP -> worker.
    trace_headers  jsonb       NOT NULL DEFAULT '{}',
    created_at     timestamptz NOT NULL DEFAULT now(),
    published_at   timestamptz NULL,
    publish_attempts integer   NOT NULL DEFAULT 0,
    last_error     text        NULL
);

CREATE INDEX outbox_events_unpublished ON outbox_events (id) WHERE published_at IS NULL;
CREATE INDEX outbox_events_published ON outbox_events (published_at) WHERE published_at IS NOT NULL;
