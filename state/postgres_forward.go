package state

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrNoSuchContext: the store has no record of the context.
var ErrNoSuchContext = errors.New("state: no such context")

// ContextKernel returns the kernel and the language of context id as
// its record says (the kernel "" when it has none): what a replica that
// accepts a run for a context another replica owns writes in the run's
// record before forwarding it. ErrNoSuchContext when there is no record.
func (p *Postgres) ContextKernel(ctx context.Context, id string) (kernel, language string, err error) {
	err = p.pool.QueryRow(ctx, `SELECT coalesce(data->>'kernelId', ''), coalesce(data->>'language', '')
		FROM contexts WHERE id = $1`, id).Scan(&kernel, &language)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", fmt.Errorf("%w: %s", ErrNoSuchContext, id)
	}
	if err != nil {
		return "", "", p.replicaCall(err)
	}
	return kernel, language, nil
}
