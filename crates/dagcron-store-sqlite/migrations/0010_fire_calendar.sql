-- The exclusion calendar that suppressed a fire (NULL for every other outcome).
ALTER TABLE fires ADD COLUMN calendar TEXT;
