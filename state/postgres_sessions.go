package state

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrNoSuchSession: the store has no record of a session of that path.
var ErrNoSuchSession = errors.New("state: no such session")

// SessionByPath returns the id of the Jupyter session of path whose
// kernel has a record (the oldest, should there be several): what a
// replica asked to make a session for a path another replica's session
// holds forwards the request to. ErrNoSuchSession when there is none.
func (p *Postgres) SessionByPath(ctx context.Context, path string) (string, error) {
	var id string
	err := p.pool.QueryRow(ctx, `SELECT s.id FROM sessions s JOIN kernels k ON k.id = s.data->>'kernelId'
		WHERE s.data->>'path' = $1 ORDER BY s.data->>'created', s.id LIMIT 1`, path).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("%w: path %q", ErrNoSuchSession, path)
	}
	if err != nil {
		return "", p.replicaCall(err)
	}
	return id, nil
}
