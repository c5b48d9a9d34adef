-- What a run's steps did so far, as the engine counts it — per run, tool, tier and outcome
-- (allowed: running, done or unknown; denied: refused; gated: needs_approval) — kept by a
-- trigger as steps are inserted, change status or are deleted. Deciding a direct call reads
-- these counts (and `run_tally`'s) instead of counting the run's steps: a client that never
-- names a run puts every call in its principal's current run, and counting its steps made
-- each call cost in proportion to the run's length (a write in a run of a few thousand steps
-- took milliseconds). Steps that decided nothing yet or may run again (pending, failed) and
-- compensations are not counted, as the engine does not count them. Keyed by outcome rather
-- than status, settling a call (running to done or unknown) changes no count, so the group
-- commit of calls that succeed touches no row here (and takes no lock on one). A step's run,
-- tool, tier and kind never change once it is inserted.
CREATE TABLE step_tally (
    run_id   TEXT NOT NULL,
    tool     TEXT NOT NULL,
    tier     TEXT NOT NULL,
    outcome  TEXT NOT NULL CHECK (outcome IN ('allowed', 'denied', 'gated')),
    n        BIGINT NOT NULL CHECK (n >= 0),
    PRIMARY KEY (run_id, tool, tier, outcome)
);

-- How the engine counts a step of this status; NULL: not at all.
CREATE FUNCTION step_outcome(status TEXT) RETURNS TEXT LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN status IN ('pending', 'failed') THEN NULL
                WHEN status = 'refused' THEN 'denied'
                WHEN status = 'needs_approval' THEN 'gated'
                ELSE 'allowed' END
$$;

INSERT INTO step_tally (run_id, tool, tier, outcome, n)
SELECT run_id, tool, tier, step_outcome(status), COUNT(*)
FROM steps WHERE kind <> 'compensation' AND step_outcome(status) IS NOT NULL
GROUP BY 1, 2, 3, 4;

CREATE FUNCTION step_tally_move() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.kind <> 'compensation'
       AND step_outcome(OLD.status) IS NOT NULL THEN
        UPDATE step_tally SET n = n - 1
        WHERE run_id = OLD.run_id AND tool = OLD.tool AND tier = OLD.tier
          AND outcome = step_outcome(OLD.status);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.kind <> 'compensation'
       AND step_outcome(NEW.status) IS NOT NULL THEN
        INSERT INTO step_tally (run_id, tool, tier, outcome, n)
        VALUES (NEW.run_id, NEW.tool, NEW.tier, step_outcome(NEW.status), 1)
        ON CONFLICT (run_id, tool, tier, outcome) DO UPDATE SET n = step_tally.n + 1;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER steps_tally_insert AFTER INSERT ON steps
FOR EACH ROW WHEN (NEW.kind <> 'compensation' AND step_outcome(NEW.status) IS NOT NULL)
EXECUTE FUNCTION step_tally_move();

CREATE TRIGGER steps_tally_update AFTER UPDATE OF status ON steps
FOR EACH ROW WHEN (NEW.kind <> 'compensation'
    AND step_outcome(OLD.status) IS DISTINCT FROM step_outcome(NEW.status))
EXECUTE FUNCTION step_tally_move();

CREATE TRIGGER steps_tally_delete AFTER DELETE ON steps
FOR EACH ROW WHEN (OLD.kind <> 'compensation' AND step_outcome(OLD.status) IS NOT NULL)
EXECUTE FUNCTION step_tally_move();
