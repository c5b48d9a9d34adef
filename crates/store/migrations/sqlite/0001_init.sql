-- toolgate store, SQLite. Times are milliseconds since the epoch (UTC), set from the
-- caller's Clock; JSON columns hold canonical JSON text.

CREATE TABLE runs (
    run_id      TEXT PRIMARY KEY,
    principal   TEXT NOT NULL,
    purpose     TEXT,
    status      TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'aborted')),
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);

CREATE TABLE steps (
    step_id      TEXT PRIMARY KEY,
    run_id       TEXT NOT NULL REFERENCES runs (run_id),
    seq          BIGINT NOT NULL,
    kind         TEXT NOT NULL CHECK (kind IN ('planned', 'direct', 'compensation')),
    principal    TEXT NOT NULL,
    role         TEXT NOT NULL,
    tool         TEXT NOT NULL,
    effect       TEXT NOT NULL CHECK (effect IN ('read', 'write', 'irreversible')),
    tier         TEXT NOT NULL CHECK (tier IN ('read', 'act', 'spend')),
    purpose      TEXT,
    reason       TEXT,
    evidence     TEXT NOT NULL DEFAULT '[]',
    actor        TEXT NOT NULL DEFAULT '{}',
    inputs       TEXT NOT NULL,
    input_hash   TEXT NOT NULL,
    idem_key     TEXT NOT NULL UNIQUE,
    status       TEXT NOT NULL DEFAULT 'pending' CHECK (status IN
                 ('pending', 'running', 'needs_approval', 'done', 'failed', 'refused', 'unknown')),
    attempts     BIGINT NOT NULL DEFAULT 0 CHECK (attempts BETWEEN 0 AND 4),
    approval     TEXT,
    outcome      TEXT,
    compensates  TEXT REFERENCES steps (step_id),
    lease_until  BIGINT,
    retry_at     BIGINT,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL,
    UNIQUE (run_id, seq)
);
CREATE INDEX steps_queue ON steps (created_at, seq) WHERE status IN ('pending', 'failed');
CREATE INDEX steps_running ON steps (lease_until) WHERE status = 'running';
CREATE INDEX steps_unknown ON steps (updated_at) WHERE status = 'unknown';
CREATE INDEX steps_run ON steps (run_id, seq);

CREATE TABLE idempotency (
    idem_key    TEXT PRIMARY KEY,
    input_hash  TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('in_flight', 'done')),
    outcome     TEXT,
    step_id     TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);

CREATE TABLE budget_usage (
    principal  TEXT NOT NULL,
    tier       TEXT NOT NULL CHECK (tier IN ('act', 'spend')),
    day        BIGINT NOT NULL,
    used       BIGINT NOT NULL DEFAULT 0 CHECK (used >= 0),
    PRIMARY KEY (principal, tier, day)
);

CREATE TABLE budget_reservations (
    step_id    TEXT NOT NULL,
    principal  TEXT NOT NULL,
    tier       TEXT NOT NULL,
    day        BIGINT NOT NULL,
    PRIMARY KEY (step_id, principal)
);

CREATE TABLE approval_requests (
    approval_id       TEXT PRIMARY KEY,
    subject           TEXT NOT NULL,
    run_id            TEXT,
    principal         TEXT NOT NULL,
    tool              TEXT NOT NULL,
    tool_version      TEXT NOT NULL,
    input_hash        TEXT NOT NULL,
    inputs            TEXT NOT NULL,
    reason            TEXT,
    evidence          TEXT NOT NULL DEFAULT '[]',
    rule              TEXT NOT NULL,
    approvers_needed  BIGINT NOT NULL,
    status            TEXT NOT NULL CHECK (status IN
                      ('pending', 'approved', 'rejected', 'expired', 'consumed')),
    created_at        BIGINT NOT NULL,
    expires_at        BIGINT NOT NULL,
    decided_at        BIGINT
);
CREATE INDEX approval_requests_subject ON approval_requests (subject);
CREATE INDEX approval_requests_open ON approval_requests (created_at) WHERE status = 'pending';

CREATE TABLE approval_grants (
    approval_id  TEXT NOT NULL REFERENCES approval_requests (approval_id),
    approver     TEXT NOT NULL,
    token        TEXT NOT NULL,
    fingerprint  TEXT NOT NULL,
    nonce        TEXT NOT NULL UNIQUE,
    granted_at   BIGINT NOT NULL,
    PRIMARY KEY (approval_id, approver)
);

CREATE TABLE consumed_nonces (
    nonce        TEXT PRIMARY KEY,
    subject      TEXT NOT NULL,
    consumed_at  BIGINT NOT NULL
);

CREATE TABLE audit (
    seq        BIGINT PRIMARY KEY,
    ts         BIGINT NOT NULL,
    principal  TEXT NOT NULL,
    run_id     TEXT,
    step_id    TEXT,
    record     TEXT NOT NULL,
    hash       TEXT NOT NULL
);
CREATE INDEX audit_principal ON audit (principal, seq);
CREATE INDEX audit_run ON audit (run_id, seq);

CREATE TABLE audit_head (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    seq   BIGINT NOT NULL,
    hash  TEXT NOT NULL
);
INSERT INTO audit_head (id, seq, hash) VALUES (1, 0, 'genesis');

CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only: UPDATE refused');
END;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only: DELETE refused');
END;
