-- Pages that a re-upload of small content held already writes in place of the pages a new row
-- of it would add (see `db::blobs::pad_pages`): one row a page, each rewritten as a whole.
CREATE TABLE write_pad (
    id    INTEGER PRIMARY KEY,
    n     BIGINT NOT NULL,
    fill  BYTEA NOT NULL
);
INSERT INTO write_pad (id, n, fill) VALUES
    (1, 0, decode(repeat('00', 3000), 'hex')), (2, 0, decode(repeat('00', 3000), 'hex')), (3, 0, decode(repeat('00', 3000), 'hex')),
    (4, 0, decode(repeat('00', 3000), 'hex')), (5, 0, decode(repeat('00', 3000), 'hex')), (6, 0, decode(repeat('00', 3000), 'hex'));
