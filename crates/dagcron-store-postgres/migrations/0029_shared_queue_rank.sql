-- The cluster's queue is taken in order of rank: the instant an attempt
-- was handed over less its priority's head start, 10 s a level (see
-- dagcron_core::priority::AGING_US, which this must equal), so a higher
-- priority goes first and a long wait still wins. Only adds: a node of
-- the version before keeps inserting without a priority (0, so its rank
-- is its instant) and claiming by queued_at, beside upgraded nodes.
ALTER TABLE shared_attempts ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
ALTER TABLE shared_attempts
    ADD COLUMN rank BIGINT GENERATED ALWAYS AS (queued_at - priority::bigint * 10000000) STORED;
CREATE INDEX shared_attempts_ranked ON shared_attempts (rank) WHERE node_epoch IS NULL;
