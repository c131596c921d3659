-- Searches across outputs (api.md v1.2): the list of outputs a search walks is fixed by its
-- first request; what is left of it when that request answers with a cursor is kept here, so
-- that any replica goes on with exactly that list. Kept a day, then removed by retention.
CREATE TABLE search_snapshots (
    id          TEXT PRIMARY KEY,       -- random, 32 hex; the cursor holds it, sealed
    namespace   TEXT NOT NULL,
    outputs     TEXT NOT NULL,          -- JSON: [["<64 hex>", {labels}], ...], in search order
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);
CREATE INDEX search_snapshots_expires ON search_snapshots (expires_at);
