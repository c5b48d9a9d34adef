-- Calls that hold no step row are counted per run here, as their audit records are written: a
-- refused direct call (it must not hold its idempotency key), and a direct read that is not
-- replayed (decided, forwarded and recorded without a reservation, so it never had a step).
-- One row per run, tool and outcome, whatever the run's length: deciding the next call reads
-- these counts beside its steps'. The refusals counted so far move here. Without a rowid, the
-- table is its key's b-tree: a count written touches one page, not a row and an index entry.
CREATE TABLE run_tally (
    run_id  TEXT NOT NULL,
    tool    TEXT NOT NULL,
    tier    TEXT NOT NULL CHECK (tier IN ('read', 'act', 'spend')),
    status  TEXT NOT NULL CHECK (status IN ('done', 'refused')),
    n       BIGINT NOT NULL CHECK (n > 0),
    PRIMARY KEY (run_id, tool, tier, status)
) WITHOUT ROWID;

INSERT INTO run_tally (run_id, tool, tier, status, n)
SELECT run_id, tool, tier, 'refused', COUNT(*) FROM run_refusals GROUP BY run_id, tool, tier;

DROP TABLE run_refusals;
