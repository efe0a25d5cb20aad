-- What a task handed downstream (dagcron_core::outputs): a JSON object of
-- names to values; none for attempts without outputs.
ALTER TABLE attempts ADD COLUMN outputs TEXT;
