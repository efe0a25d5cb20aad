-- Where each line of an attempt's output came from (stdout or stderr) and
-- when: 13 bytes a line start (dagcron_core::log::encode); none for
-- attempts ended before this column, or of a kind that has no streams.
ALTER TABLE attempts ADD COLUMN log_lines BLOB;
