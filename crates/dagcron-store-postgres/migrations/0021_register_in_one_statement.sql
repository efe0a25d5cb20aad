-- A node registers in one statement: the slot is picked and the row
-- written inside the database, under a lock that only registrations take.
-- Before, the registration held a table lock across several round trips,
-- and every other node's heartbeat waited behind it: one node with a slow
-- link to the database could fence the healthy ones.
--
-- The node's own row is locked first, without the registrations' lock:
-- the batches of its previous registration still in flight land before
-- (or are refused after), and a slow one makes only this node wait.
-- Each statement of the function reads what was committed before it
-- began, so the slots taken are read after the lock is held.
CREATE FUNCTION dagcron_register(p_id TEXT, p_address TEXT, p_version TEXT, p_ttl_ms BIGINT,
                                 p_max_nodes INTEGER, OUT r_epoch BIGINT, OUT r_slot SMALLINT)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM nodes WHERE id = p_id FOR UPDATE;
    PERFORM pg_advisory_xact_lock(hashtext('dagcron registrations'));
    -- A slot is free a lease's length after its node's lease ended: a
    -- heartbeat of that node sent in time but not yet committed would
    -- otherwise keep it alive beside a new node on the same slot.
    SELECT s INTO r_slot FROM generate_series(0, p_max_nodes - 1) AS s
    WHERE s NOT IN (SELECT n.slot FROM nodes n
                    WHERE n.id <> p_id AND n.state IN ('alive', 'draining')
                      AND n.lease_until > clock_timestamp() - p_ttl_ms * interval '1 millisecond')
    ORDER BY s LIMIT 1;
    IF r_slot IS NULL THEN
        RETURN;
    END IF;
    -- Not eligible to own jobs until its first heartbeat has checked its
    -- clock against the database's.
    INSERT INTO nodes AS n (id, epoch, slot, state, eligible, address, version, started_at, heartbeat_at, lease_until)
    VALUES (p_id, nextval('node_epochs'), r_slot, 'alive', FALSE, p_address, p_version,
            clock_timestamp(), clock_timestamp(), clock_timestamp() + p_ttl_ms * interval '1 millisecond')
    ON CONFLICT (id) DO UPDATE SET epoch = EXCLUDED.epoch, slot = EXCLUDED.slot, state = 'alive',
        eligible = FALSE, address = EXCLUDED.address, version = EXCLUDED.version,
        started_at = EXCLUDED.started_at, heartbeat_at = EXCLUDED.heartbeat_at,
        lease_until = EXCLUDED.lease_until, clock_skew_us = 0, owned_jobs = 0
    RETURNING n.epoch INTO r_epoch;
    PERFORM pg_notify('dagcron', 'nodes');
END
$$;
