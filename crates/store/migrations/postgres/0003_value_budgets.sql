-- Window budgets: sums and counts of calls over a sliding window, per budget,
-- principal and key value. A reservation is taken with the step (in its reservation
-- transaction), kept when the call lands or its outcome is unknown, and deleted when the call
-- fails; rows older than the window are never read again and are pruned under the lock.

-- One row per (budget, principal, key): PostgreSQL locks it (SELECT … FOR UPDATE) before summing
-- the window, so concurrent reservations of one window take turns. SQLite's single writer needs
-- no lock; the table exists on both so the schemas match.
CREATE TABLE window_locks (
    budget     TEXT NOT NULL,
    principal  TEXT NOT NULL,
    key_value  TEXT NOT NULL,
    PRIMARY KEY (budget, principal, key_value)
);

CREATE TABLE window_reservations (
    step_id    TEXT NOT NULL,
    budget     TEXT NOT NULL,
    principal  TEXT NOT NULL,
    key_value  TEXT NOT NULL,
    -- Units of 1/10,000 of the summed input, or 1 per call for a count.
    amount     BIGINT NOT NULL CHECK (amount >= 0),
    at         BIGINT NOT NULL,
    PRIMARY KEY (step_id, budget, principal)
);
CREATE INDEX window_reservations_window ON window_reservations (budget, principal, key_value, at);
