-- Searches across outputs walk the namespace's references by a keyset cursor (`search/mod.rs`)
-- instead of a list made by their first request: what a walk has passed is kept here, one row
-- an output, so that an output is searched once even when the reference it was searched by is
-- deleted before the walk reaches an older one. Written as the walk goes (a request writes what
-- it passed), kept a day, then removed by retention. `search_snapshots` is no longer written.
CREATE TABLE search_seen (
    search     TEXT NOT NULL,           -- the search's id, 32 hex; its cursor holds it, sealed
    digest     TEXT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (search, digest)
);
CREATE INDEX search_seen_expires ON search_seen (expires_at);
