-- The clock leases lapse by stops while no replica reaches the database (docs/replicas.md, "The
-- database restarted"): a database restarted, or cut off from every replica, is no replica's death.
--
-- cluster_clock: one row. heard_at is when a replica last reached the database, lease the --lease
-- of the last replica that said it is alive. kg_tick runs first in every
-- transaction that judges leases or replicas live: when no replica was heard for more than half a
-- lease (heartbeats and renewals come every third of one), the silence is an outage, and the leases
-- held and the replicas live when it began are moved on by its length: each gets back the time it
-- had left. A replica that alone stops renewing (dead, frozen, cut off while others are heard) has
-- its leases lapse as before.
CREATE TABLE cluster_clock (
	id       int         PRIMARY KEY CHECK (id = 1),
	heard_at timestamptz NOT NULL,
	lease    interval    NOT NULL
);
INSERT INTO cluster_clock (id, heard_at, lease) VALUES (1, now(), interval '10 seconds');
-- kg_tick(refresh): every call is a replica reaching the database, and sets the clock to now();
-- refresh, the replica's lease, is given by the calls that say a replica is alive (heartbeat,
-- acquisition, renewal), which always write; the others (NULL) only read the clock while it is less
-- than an eighth of a lease old, so that the busy statements (a commit's fence check, an owner
-- lookup) rarely write it. It locks the clock row before any lease row, as every caller does, so that
-- two ticks, or a tick and a renewal, never deadlock.
CREATE FUNCTION kg_tick(refresh interval) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	c cluster_clock;
	gap interval;
BEGIN
	SELECT * INTO c FROM cluster_clock WHERE id = 1;
	IF refresh IS NULL AND now() - c.heard_at <= c.lease / 8 THEN
		RETURN;
	END IF;
	SELECT * INTO c FROM cluster_clock WHERE id = 1 FOR UPDATE;
	gap := now() - c.heard_at;
	IF gap > c.lease / 2 THEN
		UPDATE leases SET expires_at = expires_at + gap WHERE owner <> '' AND expires_at > c.heard_at;
		UPDATE replicas SET heard_at = heard_at + gap WHERE heard_at > c.heard_at - c.lease;
	END IF;
	UPDATE cluster_clock SET heard_at = greatest(c.heard_at, now()), lease = coalesce(refresh, c.lease)
		WHERE id = 1;
END
$$;
-- kg_check_fences as before (0002), after the clock's tick.
CREATE OR REPLACE FUNCTION kg_check_fences(kernels text[], epochs bigint[], me text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	bad int[];
BEGIN
	PERFORM kg_tick(NULL);
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
