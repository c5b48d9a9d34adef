-- Plans as data: the planner, its goal and a hash of what it submitted, per run; and the model
-- reviewer's verdicts on planned steps (a record beside the step, never an approval).
CREATE TABLE plans (
    run_id        TEXT PRIMARY KEY REFERENCES runs (run_id),
    planner       TEXT NOT NULL,
    goal          TEXT NOT NULL,
    plan_hash     TEXT NOT NULL,
    submitted_at  BIGINT NOT NULL
);

CREATE TABLE step_reviews (
    step_id      TEXT NOT NULL REFERENCES steps (step_id),
    reviewer     TEXT NOT NULL,
    verdict      TEXT NOT NULL CHECK (verdict IN ('approved', 'rejected')),
    note         TEXT NOT NULL,
    reviewed_at  BIGINT NOT NULL,
    PRIMARY KEY (step_id, reviewer)
);

-- A plan-bound principal's call is matched against the steps assigned to it.
CREATE INDEX steps_assigned ON steps (principal, tool, input_hash) WHERE kind = 'planned';
