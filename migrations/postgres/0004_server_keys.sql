-- Keys shared by every replica, made once by the first server to need them: the one that
-- seals cursors (opaque, bound to the namespace that was given them).
CREATE TABLE server_keys (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL      -- 64 hex
);
