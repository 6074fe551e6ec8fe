package local

import (
	"context"

	"kernelgate/jupyter"
)

// StartCommand implements jupyter.CommandStarter.
func (fp *forkedProcess) StartCommand(ctx context.Context, req jupyter.CommandRequest) (jupyter.Command, error) {
	return fp.plan.start(ctx, req)
}

var _ jupyter.CommandStarter = (*forkedProcess)(nil)

// planForked gives a kernel forked from a zygote the plan of its commands,
// in its own cgroup (a spare child forked ahead has one of its own).
func planForked(p jupyter.Process, plan commandPlan) {
	if fp, ok := p.(*forkedProcess); ok {
		plan.cg = fp.cg
		fp.plan = plan.of(fp.done)
	}
}
