-- What a retention pass lists, in digest order, page by page: blobs whose grace has begun
-- (`db::retention::COLLECTABLE`) and deletions a crashed pass left (`STALE_DELETIONS`). Both are
-- few beside the live blobs, which have no entry here: a page reads its candidates instead of
-- walking every row (on SQLite, a snapshot held for seconds that the log's folds wait behind).
-- A new upload's row is live and out of grace, and writes nothing to either index.
CREATE INDEX blobs_in_grace ON blobs (digest) WHERE unreferenced_since IS NOT NULL;
CREATE INDEX blobs_deleting ON blobs (digest) WHERE state = 'deleting';
