-- Instants of the scheduling model are integer microseconds since the Unix
-- epoch, as in the embedded backend; leases are judged by the database's own
-- clock (timestamptz and now()).

CREATE TABLE jobs (
    namespace  TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    version    BIGINT  NOT NULL,
    spec       TEXT    NOT NULL,
    paused     BOOLEAN NOT NULL DEFAULT FALSE,
    updated_at BIGINT  NOT NULL,
    PRIMARY KEY (namespace, name)
);

CREATE TABLE job_versions (
    namespace  TEXT   NOT NULL,
    name       TEXT   NOT NULL,
    version    BIGINT NOT NULL,
    spec       TEXT   NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (namespace, name, version)
);

-- Bumped with every change of a job, so that nodes notice changes cheaply.
CREATE TABLE revisions (
    name  TEXT   PRIMARY KEY,
    value BIGINT NOT NULL
);
INSERT INTO revisions VALUES ('jobs', 0);

-- Scheduler nodes. A registration takes a new epoch; every write batch checks
-- the writer's row (state, epoch, lease) under a share lock.
CREATE SEQUENCE node_epochs;
CREATE TABLE nodes (
    id            TEXT        PRIMARY KEY,
    epoch         BIGINT      NOT NULL UNIQUE,
    slot          SMALLINT    NOT NULL,
    state         TEXT        NOT NULL,
    eligible      BOOLEAN     NOT NULL DEFAULT TRUE,
    address       TEXT        NOT NULL,
    version       TEXT        NOT NULL,
    started_at    TIMESTAMPTZ NOT NULL,
    heartbeat_at  TIMESTAMPTZ NOT NULL,
    lease_until   TIMESTAMPTZ NOT NULL,
    clock_skew_us BIGINT      NOT NULL DEFAULT 0,
    owned_jobs    BIGINT      NOT NULL DEFAULT 0
);

-- The fire ledger: one row per expected fire. The primary key is the final
-- fence against a doubled fire; node_epoch says which registration wrote it.
CREATE TABLE fires (
    namespace    TEXT   NOT NULL,
    job          TEXT   NOT NULL,
    scheduled_at BIGINT NOT NULL,
    outcome      TEXT   NOT NULL,
    run_id       BIGINT,
    node_epoch   BIGINT,
    recorded_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (namespace, job, scheduled_at)
);

CREATE TABLE runs (
    id               BIGINT  PRIMARY KEY,
    namespace        TEXT    NOT NULL,
    job              TEXT    NOT NULL,
    job_version      BIGINT  NOT NULL,
    trigger          TEXT    NOT NULL,
    scheduled_at     BIGINT  NOT NULL,
    state            TEXT    NOT NULL,
    params           TEXT    NOT NULL,
    created_at       BIGINT  NOT NULL,
    started_at       BIGINT,
    finished_at      BIGINT,
    -- The epoch of the node that runs it; NULL for a store used by one node.
    owner_epoch      BIGINT,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX runs_by_job ON runs (namespace, job, id DESC);
CREATE INDEX runs_active ON runs (owner_epoch) WHERE state IN ('pending', 'running');

CREATE TABLE tasks (
    run_id   BIGINT  NOT NULL,
    task_id  TEXT    NOT NULL,
    position INTEGER NOT NULL,
    state    TEXT    NOT NULL,
    PRIMARY KEY (run_id, task_id)
);

CREATE TABLE attempts (
    run_id      BIGINT  NOT NULL,
    task_id     TEXT    NOT NULL,
    number      INTEGER NOT NULL,
    state       TEXT    NOT NULL,
    started_at  BIGINT  NOT NULL,
    finished_at BIGINT,
    exit_code   INTEGER,
    error       TEXT,
    log         BYTEA,
    node_epoch  BIGINT,
    PRIMARY KEY (run_id, task_id, number)
);
