-- The outbox of notifications: a row is written in the commit of the event
-- it reports (one per key), claimed by a node for delivery, and each of its
-- delivery attempts recorded.
CREATE TABLE notifications (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    namespace TEXT NOT NULL,
    job TEXT NOT NULL,
    run_id BIGINT,
    event TEXT NOT NULL,
    notifier TEXT NOT NULL,
    channel TEXT NOT NULL,
    payload TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    attempts BIGINT NOT NULL DEFAULT 0,
    next_at BIGINT,
    ended_at BIGINT,
    last_status BIGINT,
    last_error TEXT,
    claimed_by TEXT,
    claimed_until BIGINT
);
CREATE INDEX notifications_due ON notifications (next_at) WHERE state = 'pending';
CREATE INDEX notifications_by_namespace ON notifications (namespace, id DESC);
CREATE TABLE notification_deliveries (
    notification_id BIGINT NOT NULL REFERENCES notifications (id) ON DELETE CASCADE,
    number BIGINT NOT NULL,
    at BIGINT NOT NULL,
    status BIGINT,
    error TEXT,
    PRIMARY KEY (notification_id, number)
);
