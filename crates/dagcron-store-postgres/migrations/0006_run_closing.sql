-- The state a running run ends in once it has been asked to stop (cancel,
-- replace, deadline): kept so that a restart or the node adopting the run
-- finishes stopping it instead of retrying its lost attempts.
ALTER TABLE runs ADD COLUMN closing TEXT;
