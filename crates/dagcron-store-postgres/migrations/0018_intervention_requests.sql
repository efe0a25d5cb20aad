-- An operator's intervention on a task (retry, mark, fail) asked through a
-- node that does not run the task's run: the node that does takes it in.
CREATE TABLE intervention_requests (
    id     BIGSERIAL PRIMARY KEY,
    run_id BIGINT NOT NULL,
    task_id TEXT  NOT NULL,
    action TEXT   NOT NULL
);
CREATE INDEX intervention_requests_by_run ON intervention_requests (run_id);
