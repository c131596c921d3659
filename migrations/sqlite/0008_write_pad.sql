-- Pages that a re-upload of small content held already writes in place of the pages a new row
-- of it would add (see `db::blobs::pad_pages`): one row a page, each rewritten as a whole.
CREATE TABLE write_pad (
    id    INTEGER PRIMARY KEY,
    n     BIGINT NOT NULL,
    fill  BLOB NOT NULL
);
INSERT INTO write_pad (id, n, fill) VALUES
    (1, 0, zeroblob(3000)), (2, 0, zeroblob(3000)), (3, 0, zeroblob(3000)),
    (4, 0, zeroblob(3000)), (5, 0, zeroblob(3000)), (6, 0, zeroblob(3000));
