-- The output so far of attempts running on a node (its last 64 KiB, and
-- how many bytes came before), published every second by that node so
-- that every node of the cluster can show it while the attempt runs;
-- withdrawn once the attempt's end (and its whole log) is written.
CREATE TABLE live_logs (
    run_id     BIGINT  NOT NULL,
    task_id    TEXT    NOT NULL,
    number     INTEGER NOT NULL,
    log        BYTEA   NOT NULL,
    updated_at BIGINT  NOT NULL,
    skipped    BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, task_id, number)
);
