package state

import (
	"context"
	"errors"
	"fmt"
)

// ErrNoSuchContext: the store has no record of the context.
var ErrNoSuchContext = errors.New("state: no such context")

// DropQueuedRun deletes a run's record, and its events, while it is the
// record a replica wrote before forwarding the run (queued, "forwarded",
// naming no request): its owner refused the run. A record the owner
// wrote since, of a run that went on, is left.
func (p *Postgres) DropQueuedRun(ctx context.Context, id string) error {
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return p.replicaCall(err)
	}
	defer tx.Rollback(ctx)
	tag, err := tx.Exec(ctx, `DELETE FROM runs WHERE id = $1
		AND convert_from(data, 'UTF8')::json->>'state' = 'queued'
		AND coalesce(convert_from(data, 'UTF8')::json->>'msgId', '') = ''
		AND convert_from(data, 'UTF8')::json->>'forwarded' = 'true'`, id)
	if err != nil {
		return p.replicaCall(err)
	}
	if tag.RowsAffected() > 0 {
		if _, err := tx.Exec(ctx, `DELETE FROM run_events WHERE run_id = $1`, id); err != nil {
			return p.replicaCall(err)
		}
	}
	return p.replicaCall(tx.Commit(ctx))
}

// RecordForwardedRun writes run id's record, data (a runs.Record's JSON,
// its kernel and language left out), with the kernel and the language of
// context's record, unless the run has a record already: the record a
// replica that accepts a run for a context another replica owns writes
// as it forwards it. The owner may have written its own before this one
// lands (its writes are newer, and fenced): that one is kept. One
// statement, one round trip. ErrNoSuchContext when context has no record.
func (p *Postgres) RecordForwardedRun(ctx context.Context, id, context string, data []byte) error {
	var found bool
	err := p.pool.QueryRow(ctx, `WITH c AS (SELECT data FROM contexts WHERE id = $2),
		ins AS (INSERT INTO runs (id, data)
			SELECT $1, convert_to(($3::jsonb || jsonb_strip_nulls(jsonb_build_object(
				'language', coalesce(c.data->>'language', ''),
				'kernel', nullif(c.data->>'kernelId', ''))))::text, 'UTF8')
			FROM c ON CONFLICT (id) DO NOTHING)
		SELECT EXISTS (SELECT 1 FROM c)`, id, context, string(data)).Scan(&found)
	if err != nil {
		return p.replicaCall(err)
	}
	if !found {
		return fmt.Errorf("%w: %s", ErrNoSuchContext, context)
	}
	return nil
}
