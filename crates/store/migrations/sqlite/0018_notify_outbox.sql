-- Notifications of raised approval requests: one row per request and webhook (by its name in
-- `approvals.notify`), with its delivery state. A gateway claims a due row with a conditional
-- UPDATE (state and claim time in the WHERE clause), so several gateways sharing the database
-- never post the same row at once; a claim that runs out (its process died) is taken again.
CREATE TABLE notify_outbox (
    approval_id    TEXT NOT NULL,
    destination    TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('due', 'sending', 'sent', 'failed')),
    attempts       BIGINT NOT NULL DEFAULT 0,
    next_at        BIGINT NOT NULL,
    claimed_until  BIGINT,
    last_error     TEXT,
    last_error_at  BIGINT,
    created_at     BIGINT NOT NULL,
    sent_at        BIGINT,
    PRIMARY KEY (approval_id, destination)
);
CREATE INDEX notify_outbox_due ON notify_outbox (next_at) WHERE state IN ('due', 'sending');
