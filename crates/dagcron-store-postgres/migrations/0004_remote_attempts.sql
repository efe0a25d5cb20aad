-- The labels an attempt handed to the cluster needs from a remote agent
-- (NULL: any node's own pool runs it). A node claims such an attempt only
-- for an agent connected to it whose labels contain these.
ALTER TABLE attempts ADD COLUMN run_on jsonb;
