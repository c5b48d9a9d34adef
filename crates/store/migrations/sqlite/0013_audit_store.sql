-- The store's identity, which every signed checkpoint of the audit chain names, so that a
-- checkpoint of one database is never taken for another's (docs/audit-chain.md). Made once,
-- at random, and never changed: like the audit table, the row refuses UPDATE and DELETE.
CREATE TABLE audit_store (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    store_id  TEXT NOT NULL
);
INSERT INTO audit_store (id, store_id) VALUES (1, lower(hex(randomblob(16))));

CREATE TRIGGER audit_store_no_update BEFORE UPDATE ON audit_store
BEGIN
    SELECT RAISE(ABORT, 'the audit store identity never changes: UPDATE refused');
END;
CREATE TRIGGER audit_store_no_delete BEFORE DELETE ON audit_store
BEGIN
    SELECT RAISE(ABORT, 'the audit store identity never changes: DELETE refused');
END;
