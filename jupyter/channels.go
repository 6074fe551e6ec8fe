package jupyter

import (
	"context"
	"fmt"
	"io"
	"log"
	"time"

	"github.com/go-zeromq/zmq4"
)

// socket is the part of a zmq4 socket the kernel client uses.
type socket interface {
	SendMulti(zmq4.Msg) error
	Recv() (zmq4.Msg, error)
	Close() error
}

var _ socket = zmq4.Socket(nil)

// dialRetry is how often a dial is retried while the kernel has not bound
// its ports yet; fine enough that start time is not quantised by it.
const dialRetry = 5 * time.Millisecond

// sendTimeout bounds a send to a kernel that stopped reading.
const sendTimeout = 30 * time.Second

// channels are the sockets of one kernel connection. All of them live on
// ctx, which only close cancels.
type channels struct {
	shell, control, stdin, iopub, hb socket
}

var quietLog = log.New(io.Discard, "", 0)

// dialChannels connects DEALER sockets for shell, control and stdin (one
// identity, so the kernel routes input_request to the sender of the
// execute_request), a SUB for iopub subscribed to everything and a REQ for
// the heartbeat. It returns once every socket is connected or ctx ends.
func dialChannels(ctx context.Context, ci *ConnInfo, identity string, maxFrame int64) (*channels, error) {
	ctx = withFrameLimit(ctx, maxFrame)
	opts := []zmq4.Option{
		zmq4.WithDialerRetry(dialRetry),
		zmq4.WithDialerMaxRetries(-1),
		zmq4.WithTimeout(sendTimeout),
		zmq4.WithLogger(quietLog),
	}
	id := zmq4.WithID(zmq4.SocketIdentity(identity))
	iopub := zmq4.NewSub(ctx, opts...)
	ch := &channels{
		iopub:   iopub,
		shell:   zmq4.NewDealer(ctx, append(opts, id)...),
		control: zmq4.NewDealer(ctx, append(opts, id)...),
		stdin:   zmq4.NewDealer(ctx, append(opts, id)...),
		hb:      zmq4.NewReq(ctx, opts...),
	}
	// iopub first, so the subscription is in place before the first request.
	dials := []struct {
		s  zmq4.Socket
		ch Channel
	}{{iopub, IOPub}, {ch.shell.(zmq4.Socket), Shell}, {ch.control.(zmq4.Socket), Control}, {ch.stdin.(zmq4.Socket), Stdin}, {ch.hb.(zmq4.Socket), Heartbeat}}
	for _, d := range dials {
		if err := d.s.Dial(limitedEndpoint(ci.Endpoint(d.ch))); err != nil {
			ch.close()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("jupyter: dial %s: %w", d.ch, err)
		}
		if d.ch == IOPub {
			if err := iopub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
				ch.close()
				return nil, fmt.Errorf("jupyter: subscribe iopub: %w", err)
			}
		}
	}
	return ch, nil
}

func (c *channels) socket(ch Channel) socket {
	switch ch {
	case Shell:
		return c.shell
	case Control:
		return c.control
	case Stdin:
		return c.stdin
	case IOPub:
		return c.iopub
	case Heartbeat:
		return c.hb
	}
	return nil
}

func (c *channels) close() {
	for _, s := range []socket{c.iopub, c.shell, c.control, c.stdin, c.hb} {
		if s != nil {
			s.Close()
		}
	}
}
