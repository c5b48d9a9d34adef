-- Preview, then commit: what a preview call rendered and will be committed. The
-- commit call names only plan_id; the gateway runs the call with exactly these inputs, so an
-- approval (bound to input_hash) is an approval of the previewed plan.
CREATE TABLE previews (
    plan_id      TEXT PRIMARY KEY,
    principal    TEXT NOT NULL,
    tool         TEXT NOT NULL,
    tool_version TEXT NOT NULL,
    input_hash   TEXT NOT NULL,
    inputs       TEXT NOT NULL,
    meta         TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL
);
