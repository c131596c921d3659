-- What a compaction pass takes next (`db::chunks::COMPACTABLE`): live raw blobs stored as files
-- or objects, in digest order. Small blobs live inline in their rows and are never compacted, so
-- they have no entry here: a pass reads the few candidates instead of walking every row (on
-- SQLite each small row's `layout` sits behind its inline bytes, on an overflow page). Inline
-- uploads write nothing to this index.
CREATE INDEX blobs_compactable ON blobs (digest) WHERE inline_data IS NULL AND state = 'live' AND layout = 'raw';
