-- A job's failure breaker: open while breaker_opened_at is set (the run that
-- opened it and the failures it opened after beside it); it counts only the
-- runs after breaker_from, the job's last run when it last closed.
ALTER TABLE jobs ADD COLUMN breaker_opened_at BIGINT;
ALTER TABLE jobs ADD COLUMN breaker_run BIGINT;
ALTER TABLE jobs ADD COLUMN breaker_failures BIGINT;
ALTER TABLE jobs ADD COLUMN breaker_from BIGINT NOT NULL DEFAULT 0;
