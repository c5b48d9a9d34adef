-- What a run's steps did so far, as the engine counts it — per run, tool, tier and outcome
-- (allowed: running, done or unknown; denied: refused; gated: needs_approval) — kept by
-- triggers as steps are inserted, change status or are deleted. Deciding a direct call reads
-- these counts (and `run_tally`'s) instead of counting the run's steps: a client that never
-- names a run puts every call in its principal's current run, and counting its steps made
-- each call cost in proportion to the run's length (a write in a run of a few thousand steps
-- took milliseconds). Steps that decided nothing yet or may run again (pending, failed) and
-- compensations are not counted, as the engine does not count them. Keyed by outcome rather
-- than status, settling a call (running to done or unknown) changes no count, so the group
-- commit of calls that succeed touches no row here. A step's run, tool, tier and kind never
-- change once it is inserted.
CREATE TABLE step_tally (
    run_id   TEXT NOT NULL,
    tool     TEXT NOT NULL,
    tier     TEXT NOT NULL,
    outcome  TEXT NOT NULL CHECK (outcome IN ('allowed', 'denied', 'gated')),
    n        BIGINT NOT NULL CHECK (n >= 0),
    PRIMARY KEY (run_id, tool, tier, outcome)
) WITHOUT ROWID;

INSERT INTO step_tally (run_id, tool, tier, outcome, n)
SELECT run_id, tool, tier,
       CASE status WHEN 'refused' THEN 'denied' WHEN 'needs_approval' THEN 'gated'
       ELSE 'allowed' END,
       COUNT(*)
FROM steps WHERE kind <> 'compensation' AND status NOT IN ('pending', 'failed')
GROUP BY 1, 2, 3, 4;

CREATE TRIGGER steps_tally_insert AFTER INSERT ON steps
WHEN NEW.kind <> 'compensation' AND NEW.status NOT IN ('pending', 'failed')
BEGIN
    INSERT INTO step_tally (run_id, tool, tier, outcome, n)
    VALUES (NEW.run_id, NEW.tool, NEW.tier,
            CASE NEW.status WHEN 'refused' THEN 'denied' WHEN 'needs_approval' THEN 'gated'
            ELSE 'allowed' END, 1)
    ON CONFLICT (run_id, tool, tier, outcome) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER steps_tally_update AFTER UPDATE OF status ON steps
WHEN NEW.kind <> 'compensation'
 AND (CASE WHEN OLD.status IN ('pending', 'failed') THEN '' WHEN OLD.status = 'refused' THEN 'denied'
      WHEN OLD.status = 'needs_approval' THEN 'gated' ELSE 'allowed' END)
  <> (CASE WHEN NEW.status IN ('pending', 'failed') THEN '' WHEN NEW.status = 'refused' THEN 'denied'
      WHEN NEW.status = 'needs_approval' THEN 'gated' ELSE 'allowed' END)
BEGIN
    UPDATE step_tally SET n = n - 1
    WHERE run_id = OLD.run_id AND tool = OLD.tool AND tier = OLD.tier
      AND outcome = CASE OLD.status WHEN 'refused' THEN 'denied'
                    WHEN 'needs_approval' THEN 'gated' ELSE 'allowed' END
      AND OLD.status NOT IN ('pending', 'failed');
    INSERT INTO step_tally (run_id, tool, tier, outcome, n)
    SELECT NEW.run_id, NEW.tool, NEW.tier,
           CASE NEW.status WHEN 'refused' THEN 'denied' WHEN 'needs_approval' THEN 'gated'
           ELSE 'allowed' END, 1
    WHERE NEW.status NOT IN ('pending', 'failed')
    ON CONFLICT (run_id, tool, tier, outcome) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER steps_tally_delete AFTER DELETE ON steps
WHEN OLD.kind <> 'compensation' AND OLD.status NOT IN ('pending', 'failed')
BEGIN
    UPDATE step_tally SET n = n - 1
    WHERE run_id = OLD.run_id AND tool = OLD.tool AND tier = OLD.tier
      AND outcome = CASE OLD.status WHEN 'refused' THEN 'denied'
                    WHEN 'needs_approval' THEN 'gated' ELSE 'allowed' END;
END;
