-- Several replicas on one database: who serves, and which replica owns each kernel.
--
-- replicas: one row per gateway process serving as a replica, written by the process itself
-- (heard_at renewed every lease/3, the row deleted when it stops cleanly). A replica is live while
-- heard_at is within the lease of the database's now().
CREATE TABLE replicas (
	id         text        PRIMARY KEY,
	url        text        NOT NULL,
	started_at timestamptz NOT NULL DEFAULT now(),
	heard_at   timestamptz NOT NULL DEFAULT now()
);
-- leases: one row per kernel that has ever been owned. A lease is held by owner while expires_at
-- is after the database's now(); owner '' or an expires_at passed means free. epoch grows by one
-- with every new term of ownership and never goes back: it is the fencing token every write about
-- the kernel is checked against.
CREATE TABLE leases (
	kernel_id  text        PRIMARY KEY,
	owner      text        NOT NULL,
	epoch      bigint      NOT NULL,
	expires_at timestamptz NOT NULL
);
CREATE INDEX leases_owner ON leases (owner);
-- kg_check_fences is the first statement of a fenced commit: it locks the lease rows of the
-- fences (kernel, epoch) held by owner (FOR SHARE: an acquire by another replica waits for the
-- commit; in kernel_id order, as RenewLeases locks them, so the two never deadlock) and raises KG001, the failing fences' positions (from 1) as JSON in DETAIL, when one is
-- not held, which rolls the whole commit back.
CREATE FUNCTION kg_check_fences(kernels text[], epochs bigint[], me text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	bad int[];
BEGIN
	PERFORM 1 FROM leases l
		WHERE (l.kernel_id, l.epoch) IN (SELECT * FROM unnest(kernels, epochs))
		AND l.owner = me AND l.expires_at > now()
		ORDER BY l.kernel_id
		FOR SHARE;
	SELECT array_agg(f.i ORDER BY f.i) INTO bad
		FROM unnest(kernels, epochs) WITH ORDINALITY AS f(k, e, i)
		WHERE NOT EXISTS (SELECT 1 FROM leases l
			WHERE l.kernel_id = f.k AND l.epoch = f.e AND l.owner = me AND l.expires_at > now());
	IF bad IS NOT NULL THEN
		RAISE EXCEPTION 'kernelgate: write under a lease not held' USING ERRCODE = 'KG001', DETAIL = to_json(bad)::text;
	END IF;
END
$$;
