-- The audit log: every change and every refused call, hash-chained.
CREATE TABLE audit (
    seq INTEGER PRIMARY KEY,
    at INTEGER NOT NULL,
    principal TEXT,
    principal_name TEXT,
    action TEXT NOT NULL,
    namespace TEXT,
    outcome INTEGER NOT NULL,
    address TEXT,
    prev_hash BLOB NOT NULL,
    hash BLOB NOT NULL
);
CREATE INDEX audit_by_namespace ON audit (namespace, seq);
