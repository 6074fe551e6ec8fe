package jupyter

import "context"

// StartCommand implements commander.
func (fp *forkedProcess) StartCommand(ctx context.Context, req CommandRequest) (*Command, error) {
	return fp.plan.start(ctx, req)
}

var _ commander = (*forkedProcess)(nil)

// planForked gives a kernel forked from a zygote the plan of its commands,
// in its own cgroup (a spare child forked ahead has one of its own).
func planForked(p Process, plan commandPlan) {
	if fp, ok := p.(*forkedProcess); ok {
		plan.cg = fp.cg
		fp.plan = plan.of(fp.done)
	}
}
