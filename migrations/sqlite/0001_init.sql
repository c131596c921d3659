-- Spillway metadata, SQLite flavour. Times are milliseconds since the Unix epoch.
CREATE TABLE tokens (
    hash        TEXT PRIMARY KEY,           -- SHA-256 of the token, hex
    namespace   TEXT NOT NULL,
    scopes      TEXT NOT NULL,              -- space-separated
    created_at  BIGINT NOT NULL
);

CREATE TABLE blobs (
    digest             TEXT PRIMARY KEY,    -- 64 hex of BLAKE3
    sha256             TEXT NOT NULL,       -- 64 hex
    size               BIGINT NOT NULL,
    lines              BIGINT NOT NULL,
    line_index         BLOB NOT NULL,
    created_at         BIGINT NOT NULL,
    state              TEXT NOT NULL DEFAULT 'live',   -- live | deleting
    unreferenced_since BIGINT,
    deleting_since     BIGINT
);
CREATE INDEX blobs_sha256 ON blobs (sha256);
CREATE INDEX blobs_unreferenced ON blobs (unreferenced_since);

CREATE TABLE refs (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    namespace   TEXT NOT NULL,
    digest      TEXT NOT NULL REFERENCES blobs (digest),
    labels      TEXT NOT NULL,              -- JSON object
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT,                     -- NULL when pinned
    pinned      BIGINT NOT NULL DEFAULT 0,
    pin_reason  TEXT
);
CREATE INDEX refs_ns_digest ON refs (namespace, digest);
CREATE INDEX refs_digest ON refs (digest);
CREATE INDEX refs_expires ON refs (expires_at);
CREATE INDEX refs_ns_id ON refs (namespace, id);

CREATE TABLE ref_labels (
    ref_id  BIGINT NOT NULL REFERENCES refs (id) ON DELETE CASCADE,
    key     TEXT NOT NULL,
    value   TEXT NOT NULL,
    PRIMARY KEY (ref_id, key)
);
CREATE INDEX ref_labels_kv ON ref_labels (key, value);

CREATE TABLE streams (
    id          TEXT PRIMARY KEY,
    namespace   TEXT NOT NULL,
    labels      TEXT NOT NULL,
    ttl_ms      BIGINT NOT NULL,
    max_bytes   BIGINT NOT NULL,
    size        BIGINT NOT NULL DEFAULT 0,
    newlines    BIGINT NOT NULL DEFAULT 0,
    last_byte   BIGINT,                     -- last byte written, for the line count
    state       TEXT NOT NULL DEFAULT 'open',
    digest      TEXT,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);
CREATE INDEX streams_expires ON streams (expires_at);

CREATE TABLE stream_chunks (
    stream_id   TEXT NOT NULL REFERENCES streams (id) ON DELETE CASCADE,
    start       BIGINT NOT NULL,            -- byte offset of the chunk in the stream
    newlines    BIGINT NOT NULL,            -- newlines before start
    data        BLOB NOT NULL,
    PRIMARY KEY (stream_id, start)
);
