-- Tokens you can manage: when each was last used (recorded at most once per cache period).
ALTER TABLE tokens ADD COLUMN last_used_at BIGINT;
-- How a background task ended, as its supervisor said at seal, and whether it hit the cap.
ALTER TABLE streams ADD COLUMN exit_code BIGINT;
ALTER TABLE streams ADD COLUMN signal TEXT;
ALTER TABLE streams ADD COLUMN hit_cap BIGINT NOT NULL DEFAULT 0;
