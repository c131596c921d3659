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

-- One writer: every change adds to shard 0. A boolean is 0 or 1.
CREATE TRIGGER blobs_totals_insert AFTER INSERT ON blobs WHEN NEW.state = 'live' BEGIN
    UPDATE store_totals SET blobs = blobs + 1, logical = logical + NEW.size,
        raw = raw + CASE WHEN NEW.inline_data IS NOT NULL OR NEW.layout = 'raw' THEN NEW.size ELSE 0 END
    WHERE shard = 0;
END;
CREATE TRIGGER blobs_totals_update AFTER UPDATE OF state, size, inline_data, layout ON blobs BEGIN
    UPDATE store_totals SET
        blobs = blobs + (NEW.state = 'live') - (OLD.state = 'live'),
        logical = logical + CASE WHEN NEW.state = 'live' THEN NEW.size ELSE 0 END
                          - CASE WHEN OLD.state = 'live' THEN OLD.size ELSE 0 END,
        raw = raw + CASE WHEN NEW.state = 'live' AND (NEW.inline_data IS NOT NULL OR NEW.layout = 'raw') THEN NEW.size ELSE 0 END
                  - CASE WHEN OLD.state = 'live' AND (OLD.inline_data IS NOT NULL OR OLD.layout = 'raw') THEN OLD.size ELSE 0 END
    WHERE shard = 0;
END;
CREATE TRIGGER blobs_totals_delete AFTER DELETE ON blobs WHEN OLD.state = 'live' BEGIN
    UPDATE store_totals SET blobs = blobs - 1, logical = logical - OLD.size,
        raw = raw - CASE WHEN OLD.inline_data IS NOT NULL OR OLD.layout = 'raw' THEN OLD.size ELSE 0 END
    WHERE shard = 0;
END;
-- The echo a re-upload of content held already writes (`db::blobs::echo_row`) does the work a
-- new row's insert does here too: it rewrites the same row and moves none of the sums. (It
-- counts itself: SQLite writes no page for an update that changes nothing.)
CREATE TRIGGER blob_echoes_totals AFTER INSERT ON blob_echoes WHEN NEW.state = 'live' BEGIN
    UPDATE store_totals SET echoes = echoes + 1, logical = logical + 0 * NEW.size,
        raw = raw + 0 * CASE WHEN NEW.inline_data IS NOT NULL OR NEW.layout = 'raw' THEN NEW.size ELSE 0 END
    WHERE shard = 0;
END;
CREATE TRIGGER packs_totals_insert AFTER INSERT ON packs WHEN NEW.state = 'live' BEGIN
    UPDATE store_totals SET packs = packs + NEW.size WHERE shard = 0;
END;
CREATE TRIGGER packs_totals_update AFTER UPDATE OF state, size ON packs BEGIN
    UPDATE store_totals SET packs = packs + CASE WHEN NEW.state = 'live' THEN NEW.size ELSE 0 END
                                          - CASE WHEN OLD.state = 'live' THEN OLD.size ELSE 0 END
    WHERE shard = 0;
END;
CREATE TRIGGER packs_totals_delete AFTER DELETE ON packs WHEN OLD.state = 'live' BEGIN
    UPDATE store_totals SET packs = packs - OLD.size WHERE shard = 0;
END;

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
