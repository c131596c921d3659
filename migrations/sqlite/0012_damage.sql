-- Integrity (api.md v1.3): outputs whose stored bytes failed their hash or were missing, and
-- chunks whose frames did. A damaged output answers `500 corrupt` on every read until an upload
-- of the same content stores it again (which removes its row here); a damaged chunk is never
-- reused by a compaction, whose fresh copy takes its place (which removes its row here). Few
-- rows: every server reads the blob marks whole, every few seconds.
CREATE TABLE damaged_blobs (
    digest   TEXT PRIMARY KEY,
    kind     TEXT NOT NULL,          -- corrupt | missing
    found_at BIGINT NOT NULL
);

CREATE TABLE damaged_chunks (
    digest   TEXT PRIMARY KEY,
    found_at BIGINT NOT NULL
);
