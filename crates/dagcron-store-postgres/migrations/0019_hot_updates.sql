-- An update that changes no indexed column, and finds room on its row's
-- page, is heap-only: it writes no index entry. Each task and attempt row is
-- updated about once after its insert (its end), so their pages keep room
-- for one more version of each row.
ALTER TABLE tasks SET (fillfactor = 50);
ALTER TABLE attempts SET (fillfactor = 40);

-- The queue of attempts handed to the cluster named `state` in its
-- predicate, so every attempt's end wrote a new entry into every index of
-- attempts. It names the node alone now: an attempt no node has taken.
-- An attempt closed before any node took it gets node 0 (no node has that
-- epoch), which takes it out of the queue; reads show it as no node.
UPDATE attempts SET node_epoch = 0 WHERE node_epoch IS NULL AND state NOT IN ('dispatching', 'running');
DROP INDEX attempts_queued;
CREATE INDEX attempts_queued ON attempts (started_at) WHERE node_epoch IS NULL;
