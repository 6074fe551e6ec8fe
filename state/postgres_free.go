package state

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// FreeKernelOf returns the kernel that the thing of kind (OfKernel,
// OfContext, OfSession, OfRun) and id belongs to, as OwnerOf finds it,
// when that kernel has a record and no replica holds its lease (released,
// or lapsed): a replica asked for it may take it over at once. ErrNoLease
// when there is no such kernel, or a replica holds it.
func (p *Postgres) FreeKernelOf(ctx context.Context, kind, id string) (string, error) {
	switch kind {
	case OfKernel, OfContext, OfSession, OfRun:
	default:
		return "", fmt.Errorf("%w: %q", ErrUnknownKind, kind)
	}
	var kernel string
	err := p.pool.QueryRow(ctx, `WITH k AS (SELECT CASE $1::text
			WHEN 'kernel' THEN $2::text
			WHEN 'context' THEN (SELECT data->>'kernelId' FROM contexts WHERE id = $2)
			WHEN 'session' THEN (SELECT data->>'kernelId' FROM sessions WHERE id = $2)
			WHEN 'run' THEN (SELECT coalesce(nullif(c.data->>'kernelId', ''), r.j->>'kernel')
				FROM (SELECT convert_from(data, 'UTF8')::json AS j FROM runs WHERE id = $2) r
				LEFT JOIN contexts c ON c.id = r.j->>'context')
		END AS id)
		SELECT l.kernel_id FROM k JOIN leases l ON l.kernel_id = k.id JOIN kernels kr ON kr.id = l.kernel_id
		WHERE l.owner = '' OR l.expires_at <= now()`, kind, id).Scan(&kernel)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("%w: %s %s", ErrNoLease, kind, id)
	}
	if err != nil {
		return "", p.replicaCall(err)
	}
	return kernel, nil
}

// RecordedKernels returns the ids of the kernels with a record: among
// replicas, each is owned by one or will be taken over by one (a start
// must not sweep their processes as left behind).
func (p *Postgres) RecordedKernels(ctx context.Context) ([]string, error) {
	rows, _ := p.pool.Query(ctx, `SELECT id FROM kernels ORDER BY id`)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return ids, p.replicaCall(err)
}
