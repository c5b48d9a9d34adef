-- The store's identity, which every signed checkpoint of the audit chain names, so that a
-- checkpoint of one database is never taken for another's (docs/audit-chain.md). Made once,
-- at random, and never changed: like the audit table, the row refuses UPDATE and DELETE.
CREATE TABLE audit_store (
    id        BIGINT PRIMARY KEY CHECK (id = 1),
    store_id  TEXT NOT NULL
);
INSERT INTO audit_store (id, store_id) VALUES (1, replace(gen_random_uuid()::text, '-', ''));

CREATE TRIGGER audit_store_no_update BEFORE UPDATE ON audit_store
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_change();
CREATE TRIGGER audit_store_no_delete BEFORE DELETE ON audit_store
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_change();
CREATE TRIGGER audit_store_no_truncate BEFORE TRUNCATE ON audit_store
    FOR EACH STATEMENT EXECUTE FUNCTION audit_refuse_change();
