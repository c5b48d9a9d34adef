-- A refused direct call holds no step row (it must not hold its idempotency key), so until now
-- deciding a call read back every stepless audit record of its run, JSON and all, to count the
-- run's refusals: a call in a long run paid for the whole run. Each such refusal is now also
-- kept here, written with its audit record, and counted with one indexed GROUP BY.
CREATE TABLE run_refusals (
    audit_seq  BIGINT PRIMARY KEY,
    run_id     TEXT NOT NULL,
    tool       TEXT NOT NULL,
    tier       TEXT NOT NULL
);
CREATE INDEX run_refusals_run ON run_refusals (run_id, tool, tier);

INSERT INTO run_refusals (audit_seq, run_id, tool, tier)
SELECT seq, run_id, json_extract(record, '$.tool'), COALESCE(json_extract(record, '$.tier'), 'read')
FROM audit
WHERE step_id IS NULL AND run_id IS NOT NULL AND json_extract(record, '$.why.decision') = 'deny';
