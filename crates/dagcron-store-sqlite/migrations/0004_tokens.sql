-- API tokens: never the secret, only its keyed hash (HMAC-SHA-256 under the
-- server's key). A token with no namespace covers the whole instance.
CREATE TABLE tokens (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    role TEXT NOT NULL,
    namespace TEXT,
    hash BLOB NOT NULL UNIQUE,
    created_at INTEGER NOT NULL,
    expires_at INTEGER,
    last_used_at INTEGER,
    revoked_at INTEGER,
    created_by TEXT
);
