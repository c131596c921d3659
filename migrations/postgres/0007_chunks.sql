-- Storage v2: blobs compacted into content-defined chunks, each compressed (zstd) and kept
-- once across all blobs and namespaces, written in packs (one object of many chunks).
-- A blob is `raw` (its bytes whole, as before) until compaction makes it `chunked`: its
-- ordered chunk list is then `blob_chunks`, and its raw copy goes.
ALTER TABLE blobs ADD COLUMN layout TEXT NOT NULL DEFAULT 'raw';   -- raw | chunked

CREATE TABLE packs (
    id             TEXT PRIMARY KEY,    -- 32 hex, random; the object is packs/<2 hex>/<id>
    size           BIGINT NOT NULL,     -- bytes of the object
    created_at     BIGINT NOT NULL,
    state          TEXT NOT NULL DEFAULT 'live',   -- live | deleting
    deleting_since BIGINT
);

CREATE TABLE chunks (
    digest      TEXT PRIMARY KEY,       -- 64 hex of BLAKE3 of the chunk's raw bytes
    pack        TEXT NOT NULL,
    pack_offset BIGINT NOT NULL,        -- where its zstd frame starts in the pack
    length      BIGINT NOT NULL,        -- bytes of the frame
    raw_length  BIGINT NOT NULL
);
CREATE INDEX chunks_pack ON chunks (pack);

CREATE TABLE blob_chunks (
    blob        TEXT NOT NULL,          -- the blob's digest
    seq         BIGINT NOT NULL,        -- 0, 1, …: the chunk's place in the blob
    chunk       TEXT NOT NULL,
    raw_offset  BIGINT NOT NULL,        -- where the chunk starts in the blob
    PRIMARY KEY (blob, seq)
);
CREATE INDEX blob_chunks_chunk ON blob_chunks (chunk);

-- Work that one server does at a time (compaction), held for a while and renewed.
CREATE TABLE leases (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    until       BIGINT NOT NULL
);
