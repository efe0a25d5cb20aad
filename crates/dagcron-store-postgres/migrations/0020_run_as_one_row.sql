-- A run is one row: its tasks and their attempts are kept in the run's row,
-- as JSON in `runs.tasks` (tasks in their order, each with its attempts,
-- oldest first). A run is then written once when it starts and once when
-- it ends, whatever number of task and attempt changes lie between: each
-- row written costs its heap tuple, an entry in each of its table's
-- indexes and its log record, and a run of one task wrote six rows before.
--
-- `rev` counts the changes of the row: a batch reads the rows it changes,
-- applies its writes to them, and writes each back only if its `rev` is the
-- one it read (another node may change a run's attempts: one it claimed
-- from the cluster, or ran for the run's owner).
ALTER TABLE runs ADD COLUMN rev BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN tasks TEXT NOT NULL DEFAULT '[]';

UPDATE runs r SET tasks = x.tasks FROM (
    SELECT t.run_id, json_agg(json_strip_nulls(json_build_object(
        'id', t.task_id,
        'state', t.state,
        'carried', CASE WHEN t.carried THEN TRUE END,
        'attempts', (SELECT json_agg(json_strip_nulls(json_build_object(
                'number', a.number,
                'state', a.state,
                'started_at', a.started_at,
                'finished_at', a.finished_at,
                'exit_code', a.exit_code,
                'error', a.error,
                'node_epoch', NULLIF(a.node_epoch, 0),
                'start_error_us', a.start_error_us
            )) ORDER BY a.number)
            FROM attempts a WHERE a.run_id = t.run_id AND a.task_id = t.task_id)
    )) ORDER BY t.position)::text AS tasks
    FROM tasks t GROUP BY t.run_id
) x WHERE r.id = x.run_id;

-- An attempt's captured output, apart from its run (read on demand, never
-- by the scheduler). An attempt with no output has no row.
CREATE TABLE attempt_logs (
    run_id  BIGINT  NOT NULL,
    task_id TEXT    NOT NULL,
    number  INTEGER NOT NULL,
    log     BYTEA   NOT NULL,
    PRIMARY KEY (run_id, task_id, number)
);
INSERT INTO attempt_logs
    SELECT run_id, task_id, number, log FROM attempts WHERE length(log) > 0;

-- The attempts handed to the cluster: waiting (no node yet) for any node
-- with room to claim, then the node that claimed it. The run's owner finds
-- the attempts other nodes run for it here.
CREATE TABLE shared_attempts (
    run_id     BIGINT  NOT NULL,
    task_id    TEXT    NOT NULL,
    number     INTEGER NOT NULL,
    queued_at  BIGINT  NOT NULL,
    run_on     JSONB,
    node_epoch BIGINT,
    PRIMARY KEY (run_id, task_id, number)
);
CREATE INDEX shared_attempts_waiting ON shared_attempts (queued_at) WHERE node_epoch IS NULL;
INSERT INTO shared_attempts
    SELECT a.run_id, a.task_id, a.number, a.started_at, a.run_on, a.node_epoch
    FROM attempts a JOIN runs r ON r.id = a.run_id
    WHERE a.node_epoch IS NULL
       OR (a.node_epoch > 0 AND a.node_epoch IS DISTINCT FROM r.owner_epoch);

DROP TABLE attempts;
DROP TABLE tasks;

-- The tasks and attempts as tables again, for reading by hand.
CREATE VIEW tasks AS
    SELECT r.id AS run_id, t.v->>'id' AS task_id, (t.p - 1)::integer AS position,
           t.v->>'state' AS state, COALESCE((t.v->>'carried')::boolean, FALSE) AS carried
    FROM runs r, jsonb_array_elements(r.tasks::jsonb) WITH ORDINALITY AS t(v, p);

CREATE VIEW attempts AS
    SELECT r.id AS run_id, t.v->>'id' AS task_id, (a.v->>'number')::integer AS number,
           a.v->>'state' AS state, (a.v->>'started_at')::bigint AS started_at,
           (a.v->>'finished_at')::bigint AS finished_at, (a.v->>'exit_code')::integer AS exit_code,
           a.v->>'error' AS error, (a.v->>'node_epoch')::bigint AS node_epoch,
           (a.v->>'start_error_us')::bigint AS start_error_us,
           (SELECT l.log FROM attempt_logs l
            WHERE l.run_id = r.id AND l.task_id = t.v->>'id' AND l.number = (a.v->>'number')::integer) AS log
    FROM runs r, jsonb_array_elements(r.tasks::jsonb) AS t(v),
         jsonb_array_elements(COALESCE(t.v->'attempts', '[]'::jsonb)) AS a(v);
