-- Growth: what the timers and `stats` read is kept, not recomputed from every row.

-- The gauges and `stats` (api.md v1.2, Storage efficiency): live blobs, their bytes, the bytes
-- of those stored whole (inline or a file), and the bytes of live packs. Moved by the triggers
-- below in the statement that changes a row (`db/totals.rs` for the invariant), in shards so
-- that PostgreSQL replicas' uploads do not all wait on one row; read by summing the shards.
-- Seeded here from what is stored.
CREATE TABLE store_totals (
    shard   BIGINT PRIMARY KEY,
    blobs   BIGINT NOT NULL DEFAULT 0,
    logical BIGINT NOT NULL DEFAULT 0,
    raw     BIGINT NOT NULL DEFAULT 0,
    packs   BIGINT NOT NULL DEFAULT 0,
    echoes  BIGINT NOT NULL DEFAULT 0   -- echoes written (SQLite; see its trigger)
);
INSERT INTO store_totals (shard, blobs, logical, raw, packs)
SELECT 0, COUNT(*), COALESCE(SUM(size), 0),
       COALESCE(SUM(CASE WHEN inline_data IS NOT NULL OR layout = 'raw' THEN size ELSE 0 END), 0),
       (SELECT COALESCE(SUM(size), 0) FROM packs WHERE state = 'live')
FROM blobs WHERE state = 'live';
INSERT INTO store_totals (shard) VALUES (1), (2), (3), (4), (5), (6), (7), (8), (9), (10), (11), (12), (13), (14), (15);

-- Each change adds to one shard picked at random: two replicas' uploads wait on the same
-- row one time in 16.
CREATE FUNCTION blobs_totals() RETURNS trigger AS $$
DECLARE
    nb BIGINT := 0;
    nl BIGINT := 0;
    nr BIGINT := 0;
    s BIGINT := floor(random() * 16);
BEGIN
    IF TG_OP <> 'DELETE' THEN
        IF NEW.state = 'live' THEN
            nb := 1;
            nl := NEW.size;
            IF NEW.inline_data IS NOT NULL OR NEW.layout = 'raw' THEN nr := NEW.size; END IF;
        END IF;
    END IF;
    IF TG_OP <> 'INSERT' THEN
        IF OLD.state = 'live' THEN
            nb := nb - 1;
            nl := nl - OLD.size;
            IF OLD.inline_data IS NOT NULL OR OLD.layout = 'raw' THEN nr := nr - OLD.size; END IF;
        END IF;
    END IF;
    IF nb <> 0 OR nl <> 0 OR nr <> 0 THEN
        UPDATE store_totals SET blobs = blobs + nb, logical = logical + nl, raw = raw + nr
        WHERE shard = s;
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;
CREATE TRIGGER blobs_totals AFTER INSERT OR DELETE OR UPDATE OF state, size, inline_data, layout ON blobs
    FOR EACH ROW EXECUTE FUNCTION blobs_totals();

CREATE FUNCTION packs_totals() RETURNS trigger AS $$
DECLARE
    np BIGINT := 0;
    s BIGINT := floor(random() * 16);
BEGIN
    IF TG_OP <> 'DELETE' THEN
        IF NEW.state = 'live' THEN np := NEW.size; END IF;
    END IF;
    IF TG_OP <> 'INSERT' THEN
        IF OLD.state = 'live' THEN np := np - OLD.size; END IF;
    END IF;
    IF np <> 0 THEN
        UPDATE store_totals SET packs = packs + np WHERE shard = s;
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;
CREATE TRIGGER packs_totals AFTER INSERT OR DELETE OR UPDATE OF state, size ON packs
    FOR EACH ROW EXECUTE FUNCTION packs_totals();

-- Packs that may have lost their last chunk list: written by whatever removes a list or points
-- a chunk elsewhere (a blob's deletion, a repair, a compaction), read and emptied by retention,
-- which checks each (`db::chunks`). Seeded with every live pack, checked once.
CREATE TABLE pack_checks (
    pack TEXT PRIMARY KEY
);
INSERT INTO pack_checks (pack) SELECT id FROM packs WHERE state = 'live';

-- Deletions of packs a crashed pass left half-done, as `blobs_deleting` for blobs.
CREATE INDEX packs_deleting ON packs (id) WHERE state = 'deleting';

-- What compaction takes: raw blobs stored as files, oldest first (`db::chunks::COMPACTABLE`).
-- A compacted blob leaves it. `blob_echoes` has the same index, so that the echo a re-upload of
-- content held already writes enters it whenever the new row it stands for would.
CREATE INDEX blobs_compactable ON blobs (created_at, digest) WHERE inline_data IS NULL AND layout = 'raw';
CREATE INDEX blob_echoes_compactable ON blob_echoes (created_at, digest) WHERE inline_data IS NULL AND layout = 'raw';
