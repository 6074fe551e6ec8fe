package jupyter

import (
	"testing"

	"kernelgate/internal/leakcheck"
)

type resources = leakcheck.Resources

func snapshot(t *testing.T) resources { return leakcheck.Snapshot(t) }

func children() []int { return leakcheck.Children() }

func checkNoLeaks(t *testing.T, before resources) { leakcheck.Check(t, before) }
