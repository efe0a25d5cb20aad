-- Secrets, encrypted (AES-256-GCM): the key id, the nonce and the
-- ciphertext; the namespace, name and version are bound to it.
CREATE TABLE secrets (
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    version INTEGER NOT NULL,
    key_id TEXT NOT NULL,
    nonce BLOB NOT NULL,
    ciphertext BLOB NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, name)
);
