-- How far from its asked instant an attempt started (timed instructions), in microseconds.
ALTER TABLE attempts ADD COLUMN start_error_us BIGINT;
