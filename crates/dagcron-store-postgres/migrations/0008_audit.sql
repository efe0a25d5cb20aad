-- The audit log: every change and every refused call, hash-chained.
CREATE TABLE audit (
    seq BIGINT PRIMARY KEY,
    at BIGINT NOT NULL,
    principal TEXT,
    principal_name TEXT,
    action TEXT NOT NULL,
    namespace TEXT,
    outcome INTEGER NOT NULL,
    address TEXT,
    prev_hash BYTEA NOT NULL,
    hash BYTEA NOT NULL
);
CREATE INDEX audit_by_namespace ON audit (namespace, seq);
