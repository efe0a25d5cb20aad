-- The idempotency keys of runs made by triggers that can come twice (a
-- webhook's delivery, a message, another run's end): one run per key and
-- job, kept for 30 days.
CREATE TABLE run_keys (
    namespace TEXT NOT NULL,
    job TEXT NOT NULL,
    key TEXT NOT NULL,
    run_id BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (namespace, job, key)
);
CREATE INDEX run_keys_by_age ON run_keys (created_at);
