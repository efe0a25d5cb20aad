-- What a task handed downstream (dagcron_core::outputs): a JSON object of
-- names to values; none for attempts without outputs. A task carried over
-- by a re-run keeps the outputs it had in the run re-run.
ALTER TABLE attempts ADD COLUMN outputs TEXT;
ALTER TABLE tasks ADD COLUMN outputs TEXT;
