-- API tokens: never the secret, only its keyed hash (HMAC-SHA-256 under the
-- server's key). A token with no namespace covers the whole instance.
CREATE TABLE tokens (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    role TEXT NOT NULL,
    namespace TEXT,
    hash BYTEA NOT NULL UNIQUE,
    created_at BIGINT NOT NULL,
    expires_at BIGINT,
    last_used_at BIGINT,
    revoked_at BIGINT,
    created_by TEXT
);
