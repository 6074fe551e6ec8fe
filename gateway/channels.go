package gateway

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"kernelgate/runs"
	"kernelgate/sessions"
)

const writeWait = 10 * time.Second

var writeBuffers = &sync.Pool{}

// channels upgrades to the kernel websocket and bridges it to the kernel.
func (s *Server) channels(c echo.Context) error {
	r := c.Request()
	if !isUpgrade(r) {
		return newError(http.StatusBadRequest, "BAD_REQUEST", "this endpoint needs a websocket upgrade")
	}
	if !s.originAllowed(r) {
		return newError(http.StatusForbidden, "FORBIDDEN", "Blocking Cross Origin WebSocket Attempt: origin not allowed")
	}
	k, err := s.kernel(c)
	if err != nil {
		return err
	}
	p, _ := c.Get(principalKey).(principal)
	if p.context != "" {
		ctx, err := s.mgr.Context(p.context)
		if err != nil || ctx.KernelID() != k.ID() {
			return newError(http.StatusForbidden, "FORBIDDEN", "this context token is for another kernel")
		}
		if err := s.checkContext(c, p.context); err != nil {
			return err
		}
	}
	client, err := k.Attach(r.URL.Query().Get("session_id"))
	if err != nil {
		return err
	}
	up := websocket.Upgrader{
		Subprotocols:    []string{v1Protocol},
		CheckOrigin:     func(*http.Request) bool { return true }, // checked above
		ReadBufferSize:  4096,
		WriteBufferSize: 32 << 10,
		WriteBufferPool: writeBuffers,
	}
	conn, err := up.Upgrade(c.Response(), r, nil)
	if err != nil {
		client.Close()
		return nil // the upgrader answered the client
	}
	ws := &wsConn{s: s, conn: conn, client: client, proto: legacyProtocol, tokenContext: p.context,
		toClient:      s.metrics.wsMessages.WithLabelValues("to_client"),
		toClientBytes: s.metrics.wsBytes.WithLabelValues("to_client"),
		toKernel:      s.metrics.wsMessages.WithLabelValues("to_kernel"),
		toKernelBytes: s.metrics.wsBytes.WithLabelValues("to_kernel")}
	if conn.Subprotocol() == v1Protocol {
		ws.proto = v1
	}
	ws.ctx, ws.cancel = context.WithCancel(context.Background())
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ws.finish()
		return nil
	}
	s.conns[ws] = struct{}{}
	s.wg.Add(2)
	s.mu.Unlock()
	go ws.readPump()
	go ws.writePump()
	c.Response().Status = http.StatusSwitchingProtocols // for the request log
	return nil
}

// wsConn is one kernel websocket: a read pump forwarding client messages
// to the kernel and a write pump sending the client's queue.
type wsConn struct {
	s      *Server
	conn   *websocket.Conn
	client *sessions.Client
	proto  wsProtocol
	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once
	// tokenContext is the context of the context token that opened the
	// websocket ("" for other credentials): revoking its tokens closes it.
	tokenContext string

	toClient, toClientBytes, toKernel, toKernelBytes prometheus.Counter
}

func (ws *wsConn) finish() {
	ws.once.Do(func() {
		ws.cancel()
		ws.client.Close()
		ws.conn.Close()
		ws.s.mu.Lock()
		delete(ws.s.conns, ws)
		ws.s.mu.Unlock()
	})
}

// closeTokenSockets closes the websockets opened with a context token of
// context id, or of any context when id is "".
func (s *Server) closeTokenSockets(id string) {
	var revoked []*wsConn
	s.mu.Lock()
	for ws := range s.conns {
		if ws.tokenContext != "" && (id == "" || ws.tokenContext == id) {
			revoked = append(revoked, ws)
		}
	}
	s.mu.Unlock()
	for _, ws := range revoked {
		ws.closeWith(websocket.ClosePolicyViolation, "context token revoked")
		ws.finish()
	}
}

// closeGoingAway tells the client the gateway is going away.
func (ws *wsConn) closeGoingAway() {
	ws.conn.WriteControl(websocket.CloseMessage,
		websocket.FormatCloseMessage(websocket.CloseGoingAway, "kernelgate is shutting down"), time.Now().Add(time.Second))
	ws.finish()
}

func (ws *wsConn) pongWait() time.Duration { return 3 * ws.s.cfg.PingInterval }

func (ws *wsConn) readPump() {
	defer ws.s.wg.Done()
	defer ws.finish()
	ws.conn.SetReadLimit(ws.s.cfg.MaxFrameBytes)
	ws.conn.SetReadDeadline(time.Now().Add(ws.pongWait()))
	ws.conn.SetPongHandler(func(string) error {
		return ws.conn.SetReadDeadline(time.Now().Add(ws.pongWait()))
	})
	for {
		mt, data, err := ws.conn.ReadMessage()
		if err != nil {
			return
		}
		ws.conn.SetReadDeadline(time.Now().Add(ws.pongWait()))
		var chName string
		var m *sessions.Message
		switch {
		case ws.proto == v1:
			chName, m, err = decodeV1(data)
		case mt == websocket.TextMessage:
			chName, m, err = decodeLegacyText(data)
		default:
			chName, m, err = decodeLegacyBinary(data)
		}
		if err != nil {
			// A frame that could not be read at all is answered on shell,
			// the channel of a legacy message that names none.
			chName, header := "shell", []byte(nil)
			var bad *unreadableError
			if errors.As(err, &bad) {
				chName, header = bad.channel, bad.header
			}
			ws.refuse(chName, header, err)
			continue
		}
		ch, ok := sessions.ParseChannel(chName)
		if !ok {
			if len(chName) > 32 { // the client's string: a bounded part of it
				chName = chName[:32] + "…"
			}
			ws.s.log.Warn("a websocket message for an unknown channel was dropped", "kernel", ws.client.Kernel().ID(), "channel", chName)
			continue
		}
		ws.toKernel.Inc()
		ws.toKernelBytes.Add(float64(len(data)))
		if err := ws.client.Send(ws.ctx, ch, m); err != nil {
			if errors.Is(err, sessions.ErrKernelGone) || errors.Is(err, sessions.ErrClientClosed) || ws.ctx.Err() != nil {
				return
			}
			if errors.Is(err, sessions.ErrConflict) {
				// A msg_id already awaiting its reply: an answer with that
				// parent would end the first request for the client.
				ws.s.log.Warn("a websocket request was not forwarded to the kernel", "kernel", ws.client.Kernel().ID(), "channel", ch.String(), "err", err)
				continue
			}
			ws.refuse(chName, m.RawHeader, err)
		}
	}
}

// refuse logs a client message that cannot go to the kernel and answers
// it to the client with an error on its channel (on shell when the
// channel is unknown), never in silence.
func (ws *wsConn) refuse(chName string, header []byte, err error) {
	ch, ok := sessions.ParseChannel(chName)
	if !ok {
		ch = sessions.Shell
	}
	ws.s.log.Warn("a websocket message could not be forwarded to the kernel", "kernel", ws.client.Kernel().ID(), "channel", ch.String(), "err", err)
	ws.client.Refuse(ch, header, err.Error())
}

func (ws *wsConn) writePump() {
	defer ws.s.wg.Done()
	defer ws.finish()
	var buf []byte
	// One timer for the pings, every PingInterval whatever the traffic: a
	// timer per wait would cost more than the write it waits for.
	ping := time.NewTimer(ws.s.cfg.PingInterval)
	defer ping.Stop()
	for {
		items, err := ws.client.Take()
		if err != nil {
			switch {
			case errors.Is(err, sessions.ErrKernelGone):
				ws.closeWith(websocket.CloseNormalClosure, "kernel shut down")
			case errors.Is(err, sessions.ErrSlowClient):
				ws.closeWith(websocket.CloseTryAgainLater, "client too slow: reconnect")
			}
			return
		}
		if len(items) == 0 {
			select {
			case <-ws.client.Ready():
			case <-ping.C:
				if ws.conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(writeWait)) != nil {
					return
				}
				ping.Reset(ws.s.cfg.PingInterval)
			case <-ws.ctx.Done():
				return
			}
			continue
		}
		ws.conn.SetWriteDeadline(time.Now().Add(writeWait))
		n := 0
		for _, o := range items {
			if buf, err = ws.write(buf[:0], o); err != nil {
				return
			}
			n += o.Msg.Size()
		}
		ws.toClient.Add(float64(len(items)))
		ws.toClientBytes.Add(float64(n))
	}
}

func (ws *wsConn) closeWith(code int, text string) {
	ws.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), time.Now().Add(time.Second))
}

// write sends one message in the connection's framing.
func (ws *wsConn) write(buf []byte, o runs.Outgoing) ([]byte, error) {
	ch := o.Channel.String()
	if ws.proto == v1 {
		w, err := ws.conn.NextWriter(websocket.BinaryMessage)
		if err != nil {
			return buf, err
		}
		if err := writeV1(w, ch, o.Msg); err != nil {
			return buf, err
		}
		return buf, w.Close()
	}
	if len(o.Msg.Buffers) > 0 {
		buf = appendLegacyBinary(buf, ch, o.Msg)
		return buf, ws.conn.WriteMessage(websocket.BinaryMessage, buf)
	}
	buf = appendLegacyJSON(buf, ch, o.Msg, true)
	return buf, ws.conn.WriteMessage(websocket.TextMessage, buf)
}
