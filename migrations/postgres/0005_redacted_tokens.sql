-- Redacted tokens (api.md v1.2): every read through one is redacted, and raw bytes are refused.
ALTER TABLE tokens ADD COLUMN redacted BIGINT NOT NULL DEFAULT 0;
