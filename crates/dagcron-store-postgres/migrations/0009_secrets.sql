-- Secrets, encrypted (AES-256-GCM): the key id, the nonce and the
-- ciphertext; the namespace, name and version are bound to it.
CREATE TABLE secrets (
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    version BIGINT NOT NULL,
    key_id TEXT NOT NULL,
    nonce BYTEA NOT NULL,
    ciphertext BYTEA NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (namespace, name)
);
