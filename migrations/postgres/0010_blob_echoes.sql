-- What a re-upload of content held already writes in place of the content's row: a row of the
-- same shape, into a table of the same shape (see `db::blobs::echo_row`), so that its commit
-- does the work of a new row's and its timing tells nothing. Nothing reads it; the SQLite
-- writer empties it every few seconds. It replaces `write_pad`, which approximated that work.
-- (Written on SQLite only, whose writer runs those statements; here so that both schemas match.)
CREATE TABLE blob_echoes (
    digest             TEXT NOT NULL,
    sha256             TEXT NOT NULL,
    size               BIGINT NOT NULL,
    lines              BIGINT NOT NULL,
    line_index         BYTEA NOT NULL,
    created_at         BIGINT NOT NULL,
    state              TEXT NOT NULL DEFAULT 'live',
    unreferenced_since BIGINT,
    deleting_since     BIGINT,
    inline_data        BYTEA,
    layout             TEXT NOT NULL DEFAULT 'raw'
);
CREATE INDEX blob_echoes_digest ON blob_echoes (digest);
CREATE INDEX blob_echoes_sha256 ON blob_echoes (sha256);
CREATE INDEX blob_echoes_unreferenced ON blob_echoes (unreferenced_since);

DROP TABLE write_pad;
