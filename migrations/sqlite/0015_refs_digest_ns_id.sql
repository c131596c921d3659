-- References by content keep their order too: (digest, namespace, id) in place of (digest,
-- namespace). The listing of one output's references (`GET /v1/refs?digest=`, the viewer's
-- header) reads the newest of them from it in order; with (digest, namespace) alone a planner
-- may walk the whole namespace's `refs_ns_id` backwards to find them (`db::plans`). Every other
-- lookup by content is answered by the new index as it was by the old one.
CREATE INDEX refs_digest_ns_id ON refs (digest, namespace, id);
DROP INDEX refs_digest_ns;
