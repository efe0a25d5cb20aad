-- Attempts handed to the cluster wait, unclaimed, in `dispatching` with no
-- node; any node with free capacity claims the oldest ones.
CREATE INDEX attempts_queued ON attempts (started_at) WHERE state = 'dispatching' AND node_epoch IS NULL;
