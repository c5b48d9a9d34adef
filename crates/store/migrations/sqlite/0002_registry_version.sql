-- The registry version (content hash) a call was parked under. An approval token issued for
-- the request binds it with the gating rule; after a reload the approval carries over only
-- while the current rules gate the call under the same rule.
ALTER TABLE approval_requests ADD COLUMN registry_version TEXT;
