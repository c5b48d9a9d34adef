-- The pinned upstream definition hash (toolgate.lock) a call was parked under: an approval
-- token issued for the request binds it, so the approval no longer verifies once the
-- upstream's definition of the tool changed. NULL for tools with no pinned upstream.
ALTER TABLE approval_requests ADD COLUMN definition_hash TEXT;
