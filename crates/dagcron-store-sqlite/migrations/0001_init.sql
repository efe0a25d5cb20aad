-- Instants are stored as integer microseconds since the Unix epoch.

CREATE TABLE jobs (
    namespace  TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    spec       TEXT    NOT NULL,
    paused     INTEGER NOT NULL DEFAULT 0,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, name)
);

CREATE TABLE job_versions (
    namespace  TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    spec       TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, name, version)
);

-- The fire ledger: one row per expected fire. The primary key is the final
-- fence against a doubled fire.
CREATE TABLE fires (
    namespace    TEXT    NOT NULL,
    job          TEXT    NOT NULL,
    scheduled_at INTEGER NOT NULL,
    outcome      TEXT    NOT NULL,
    run_id       INTEGER,
    PRIMARY KEY (namespace, job, scheduled_at)
) WITHOUT ROWID;

CREATE TABLE runs (
    id           INTEGER PRIMARY KEY,
    namespace    TEXT    NOT NULL,
    job          TEXT    NOT NULL,
    job_version  INTEGER NOT NULL,
    trigger      TEXT    NOT NULL,
    scheduled_at INTEGER NOT NULL,
    state        TEXT    NOT NULL,
    params       TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    started_at   INTEGER,
    finished_at  INTEGER
);
CREATE INDEX runs_by_job ON runs (namespace, job, id DESC);
CREATE INDEX runs_active ON runs (state) WHERE state IN ('pending', 'running');

CREATE TABLE tasks (
    run_id   INTEGER NOT NULL,
    task_id  TEXT    NOT NULL,
    position INTEGER NOT NULL,
    state    TEXT    NOT NULL,
    PRIMARY KEY (run_id, task_id)
) WITHOUT ROWID;

CREATE TABLE attempts (
    run_id      INTEGER NOT NULL,
    task_id     TEXT    NOT NULL,
    number      INTEGER NOT NULL,
    state       TEXT    NOT NULL,
    started_at  INTEGER NOT NULL,
    finished_at INTEGER,
    exit_code   INTEGER,
    error       TEXT,
    log         BLOB,
    PRIMARY KEY (run_id, task_id, number)
) WITHOUT ROWID;
