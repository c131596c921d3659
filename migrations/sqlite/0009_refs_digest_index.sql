-- One index of references by content, (digest, namespace), in place of (namespace, digest) and
-- (digest): it answers both lookups (by content alone, and by content within a namespace), and
-- every upload's new reference writes one random index page fewer (about a fifth of the bytes
-- a 4 KiB upload writes; docs/benchmarks.md). What reads refs by namespace alone uses refs_ns_id.
CREATE INDEX refs_digest_ns ON refs (digest, namespace);
DROP INDEX refs_ns_digest;
DROP INDEX refs_digest;
