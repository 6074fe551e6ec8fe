package sessions

import (
	"context"

	"kernelgate/jupyter"
	"kernelgate/runs"
)

// process is what sessions uses of one running kernel process. The real
// one is a *jupyter.Kernel (through jupyterProcess); tests give a fake.
type process interface {
	PID() int
	Info() jupyter.KernelInfo
	// Done is closed when the process ended; Err then says why.
	Done() <-chan struct{}
	Err() error
	NewMessage(t MsgType, content any, parent *Message) (*Message, error)
	Send(ch Channel, m *Message) error
	// Request sends m and routes what answers it to h (see
	// jupyter.Kernel.Request); Forget stops that routing.
	Request(ch Channel, m *Message, h jupyter.Handler, opts jupyter.CallOptions) (runs.Call, error)
	Forget(c runs.Call)
	Interrupt(ctx context.Context) error
	Shutdown(ctx context.Context) error
}

// starter starts a kernel process from its configuration.
type starter func(context.Context, jupyter.Config) (process, error)

// startJupyter starts a real kernel process with prov.
func startJupyter(prov jupyter.Provisioner) starter {
	return func(ctx context.Context, c jupyter.Config) (process, error) {
		jk, err := jupyter.Start(ctx, prov, c)
		if err != nil {
			return nil, err
		}
		return jupyterProcess{jk}, nil
	}
}

// reconnector starts connecting to a kernel process an earlier gateway
// launched: it returns once the process is found to be the same live one;
// ctx bounds the rest (the kernel proving itself).
type reconnector func(context.Context, jupyter.ProvisionerInfo, jupyter.Config) (connecting, error)

// connecting is a kept kernel process being connected to (a
// *jupyter.Connecting).
type connecting interface {
	// Done is closed once the kernel answered with its key, or failed to.
	Done() <-chan struct{}
	// Result waits for Done: the connected process, or why there is none
	// (the process is then left running).
	Result() (process, error)
	PID() int
	Interrupt(ctx context.Context) error
}

// reconnectJupyter adopts a real kernel process with prov and connects to
// it.
func reconnectJupyter(prov jupyter.Provisioner) reconnector {
	return func(ctx context.Context, info jupyter.ProvisionerInfo, c jupyter.Config) (connecting, error) {
		jc, err := jupyter.BeginReconnect(ctx, prov, info, c)
		if err != nil {
			return nil, err
		}
		return jupyterConnecting{jc}, nil
	}
}

// jupyterConnecting adapts a *jupyter.Connecting to connecting.
type jupyterConnecting struct{ *jupyter.Connecting }

func (c jupyterConnecting) Result() (process, error) {
	jk, err := c.Connecting.Result()
	if err != nil {
		return nil, err
	}
	return jupyterProcess{jk}, nil
}

// jupyterProcess adapts a *jupyter.Kernel to process.
type jupyterProcess struct{ *jupyter.Kernel }

var _ process = jupyterProcess{}

func (p jupyterProcess) Request(ch Channel, m *Message, h jupyter.Handler, opts jupyter.CallOptions) (runs.Call, error) {
	c, err := p.Kernel.Request(ch, m, h, opts)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (p jupyterProcess) Forget(c runs.Call) {
	if jc, ok := c.(*jupyter.Call); ok {
		p.Kernel.Forget(jc)
	}
}

// startExecute sends an execute_request to p; the call completes once both
// its reply and its status: idle have arrived.
func startExecute(p process, content jupyter.ExecuteContent, h jupyter.Handler) (runs.Call, error) {
	m, err := p.NewMessage(jupyter.ExecuteRequest, content, nil)
	if err != nil {
		return nil, err
	}
	return p.Request(Shell, m, h, jupyter.CallOptions{IOPub: true})
}
