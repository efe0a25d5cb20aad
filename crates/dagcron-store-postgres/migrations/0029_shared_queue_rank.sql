-- The cluster's queue is taken in order of rank: the instant an attempt
-- was handed over less its priority's head start (10 s a level), so a
-- higher priority goes first and a long wait still wins (see
-- dagcron_core::priority). For the attempts queued before, rank is their
-- instant (priority 0).
ALTER TABLE shared_attempts RENAME COLUMN queued_at TO rank;
