-- `steps_run (run_id, seq)` duplicated the index the table's UNIQUE (run_id, seq) already
-- keeps: every new step wrote one more index page for nothing (on SQLite one more WAL frame
-- per governed call).
DROP INDEX IF EXISTS steps_run;
