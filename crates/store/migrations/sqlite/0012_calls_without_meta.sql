-- Calls from clients that send no `_meta`.
--
-- The current run of each principal's calls that name none: joined while calls keep coming,
-- replaced by a new one after `runs.idle_minutes` without a call. One row per principal, so
-- every gateway sharing the store agrees on it.
CREATE TABLE principal_runs (
    principal  TEXT PRIMARY KEY,
    run_id     TEXT NOT NULL,
    last_at    BIGINT NOT NULL
);

-- The decision that let a step's call through (its checks and approval), written when the call
-- is reserved, so a call interrupted between the upstream's commit and its outcome record still
-- has its allow decision in the audit chain: recovery appends it from here.
ALTER TABLE steps ADD COLUMN decision TEXT;

-- Who decided an approval request and the note they gave, so a retry of a rejected call is
-- answered with the rejection and its note instead of a new request.
ALTER TABLE approval_requests ADD COLUMN decided_by TEXT;
ALTER TABLE approval_requests ADD COLUMN note TEXT;
