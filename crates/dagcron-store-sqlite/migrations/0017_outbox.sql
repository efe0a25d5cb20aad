-- The outbox of notifications: a row is written in the commit of the event
-- it reports (one per key), claimed by a node for delivery, and each of its
-- delivery attempts recorded.
CREATE TABLE notifications (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL UNIQUE,
    namespace TEXT NOT NULL,
    job TEXT NOT NULL,
    run_id INTEGER,
    event TEXT NOT NULL,
    notifier TEXT NOT NULL,
    channel TEXT NOT NULL,
    payload TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at INTEGER,
    ended_at INTEGER,
    last_status INTEGER,
    last_error TEXT,
    claimed_by TEXT,
    claimed_until INTEGER
);
CREATE INDEX notifications_due ON notifications (next_at) WHERE state = 'pending';
CREATE INDEX notifications_by_namespace ON notifications (namespace, id DESC);
CREATE TABLE notification_deliveries (
    notification_id INTEGER NOT NULL REFERENCES notifications (id) ON DELETE CASCADE,
    number INTEGER NOT NULL,
    at INTEGER NOT NULL,
    status INTEGER,
    error TEXT,
    PRIMARY KEY (notification_id, number)
);
