-- Approvers' sessions on the web page, shared by every gateway replica of one database and
-- kept across restarts. The cookie's value is never stored: only its sha256.
CREATE TABLE console_sessions (
    id_hash    TEXT PRIMARY KEY,
    principal  TEXT NOT NULL,
    csrf       TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX console_sessions_expires ON console_sessions (expires_at);
