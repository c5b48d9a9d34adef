-- One row whose counter a group commit bumps when it has nothing else to write, so that its
-- commit still reaches the disk (a barrier for reservations committed without an fsync).
CREATE TABLE sync_barrier (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    n BIGINT NOT NULL
);
INSERT INTO sync_barrier (id, n) VALUES (1, 0);
