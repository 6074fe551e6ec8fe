//go:build linux

package jupyter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"kernelgate/internal/testkernels"
)

// startLimited starts ipykernel with the given message bounds and shuts it
// down when the test ends.
func startLimited(t *testing.T, cfg Config) *Kernel {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg.Spec = testkernels.Spec(t, "python3")
	k, err := Start(ctx, testProvisioner(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Shutdown(context.Background()) })
	return k
}

// run executes code and returns its iopub messages; the request must end
// with an ok reply.
func run(t *testing.T, k *Kernel, code string) *collector {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := newCollector()
	reply, err := k.Execute(ctx, code, c.handle)
	if err != nil {
		t.Fatalf("%.60s: %v", code, err)
	}
	var rc struct {
		Status string `json:"status"`
		EValue string `json:"evalue"`
	}
	reply.DecodeContent(&rc)
	if rc.Status != "ok" {
		t.Fatalf("%.60s: reply %s %s", code, rc.Status, rc.EValue)
	}
	return c
}

// streamText is the text of the stream messages of c, and the bytes the
// reader cut from them.
func streamText(t *testing.T, c *collector) (text string, cut int64) {
	t.Helper()
	var b strings.Builder
	for _, m := range c.ofType(StreamMsg) {
		var sc struct{ Text string }
		if err := m.DecodeContent(&sc); err != nil {
			t.Fatal(err)
		}
		b.WriteString(sc.Text)
		cut += m.Cut
	}
	return b.String(), cut
}

// A print of 300 MB arrives as one message far over the message limit: it
// is cut to its head and tail with the marker between them as it is read,
// the request completes and the kernel keeps its state.
func TestOversizedOutputIsCutAndTheKernelKept(t *testing.T) {
	const keep = 1 << 20
	k := startLimited(t, Config{MaxFrame: 16 << 20, KeepOutput: keep})
	run(t, k, "survivor = 42")

	c := run(t, k, "for i in range(300): print(('%03d' % i) + 'y' * 1_000_000)\nprint('end of output')")
	text, cut := streamText(t, c)
	over := false
	for _, m := range c.ofType(StreamMsg) {
		if m.Size() > keep+markerRoom+1024 {
			t.Fatalf("a stream message kept %d bytes, the limit is %d", m.Size(), keep)
		}
		over = over || int64(m.Size())+m.Cut > 16<<20
	}
	if !over {
		t.Fatal("no message came over the message limit: the test proves nothing")
	}
	if !strings.HasPrefix(text, "000yyy") || !strings.HasSuffix(text, "yyy\nend of output\n") {
		t.Fatalf("kept text is not the head and the tail: %.20q … %q", text, text[max(0, len(text)-20):])
	}
	markers := 0
	for _, m := range c.ofType(StreamMsg) {
		if m.Cut > 0 {
			var sc struct{ Text string }
			m.DecodeContent(&sc)
			i := strings.Index(sc.Text, TruncationMarker(m.Cut))
			if i < keep/4 || i > keep {
				t.Fatalf("marker at %d of %d, want it between the head and the tail", i, len(sc.Text))
			}
			markers += len(TruncationMarker(m.Cut))
		}
	}
	if len(text)-markers+int(cut) != 300*(1_000_000+4)+14 {
		t.Errorf("kept %d + cut %d bytes, want %d printed", len(text)-markers, cut, 300*(1_000_000+4)+14)
	}

	// A huge text bundle keeps its head and tail; a huge image is replaced
	// by the marker; both leave the kernel as it was.
	c = run(t, k, "from IPython.display import display\n"+
		"display({'text/plain': 'head' + 'z' * 40_000_000 + 'tail'}, raw=True)\n"+
		"display({'image/png': 'A' * 40_000_000, 'text/plain': '<Figure>'}, raw=True)")
	results := c.ofType(DisplayData)
	if len(results) != 2 {
		t.Fatalf("%d display_data messages, want 2", len(results))
	}
	var text0, text1 struct {
		Data map[string]string `json:"data"`
	}
	results[0].DecodeContent(&text0)
	results[1].DecodeContent(&text1)
	if p := text0.Data["text/plain"]; !strings.HasPrefix(p, "headzzz") || !strings.HasSuffix(p, "zzztail") || !strings.Contains(p, "[kernelgate] output truncated: ") || len(p) > keep {
		t.Errorf("text bundle kept %d bytes: %.20q … %.40q", len(p), p, p[max(0, len(p)-40):])
	}
	if _, ok := text1.Data["image/png"]; ok || !strings.Contains(text1.Data["text/plain"], "[kernelgate] output truncated: ") || results[1].Cut < 40_000_000 {
		t.Errorf("image bundle: %v cut %d, want only the marker", text1.Data, results[1].Cut)
	}

	c = run(t, k, "print(survivor)")
	if text, _ := streamText(t, c); text != "42\n" {
		t.Fatalf("state after the big output: %q, want 42", text)
	}
	if err := k.Err(); err != nil {
		t.Fatalf("kernel: %v", err)
	}
}

// sendFromKernel is Python that publishes a message of type typ on iopub
// with n buffers of size bytes each.
func sendFromKernel(typ string, content string, n, size int) string {
	return "k = get_ipython().kernel\n" +
		"k.session.send(k.iopub_socket, '" + typ + "', " + content + ", parent=k.get_parent(), buffers=[b'x' * " +
		itoa(size) + "] * " + itoa(n) + ")"
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// A message is bounded as a whole and in its number of frames, not only
// frame by frame: output over them is cut and the kernel kept, any other
// message over them stops the kernel.
func TestMessageBoundedWholeAndInFrames(t *testing.T) {
	cfg := Config{MaxFrame: 8 << 20, MaxFrames: 64, KeepOutput: 4 << 20}

	k := startLimited(t, cfg)
	run(t, k, "survivor = 7")
	// Output with 41 buffers of 1 MiB: 41 MiB, each frame within the limit.
	c := run(t, k, sendFromKernel("display_data", "{'data': {'text/plain': 'buffers'}, 'metadata': {}}", 41, 1<<20))
	d := c.ofType(DisplayData)
	if len(d) != 1 || d[0].Size() > int(cfg.KeepOutput) || d[0].Cut < 36<<20 {
		t.Fatalf("display with 41 MiB of buffers: %d messages, want one cut to %d bytes", len(d), cfg.KeepOutput)
	}
	// Output in 200 frames: those past the count are dropped.
	c = run(t, k, sendFromKernel("display_data", "{'data': {'text/plain': 'frames'}, 'metadata': {}}", 200, 10))
	if d := c.ofType(DisplayData); len(d) != 1 || len(d[0].Buffers) > cfg.MaxFrames || d[0].Cut == 0 {
		t.Fatalf("display with 200 buffers: want one message cut to %d frames", cfg.MaxFrames)
	}
	if text, _ := streamText(t, run(t, k, "print(survivor)")); text != "7\n" {
		t.Fatalf("state: %q", text)
	}

	for _, tc := range []struct{ name, code string }{
		{"41 frames of 1 MiB", sendFromKernel("comm_msg", "{'comm_id': 'c', 'data': {}}", 41, 1<<20)},
		{"200 frames", sendFromKernel("comm_msg", "{'comm_id': 'c', 'data': {}}", 200, 10)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := startLimited(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			_, err := k.Execute(ctx, tc.code, nil)
			var died *DiedError
			if !errors.As(err, &died) || !strings.Contains(died.Reason, "over the size limit") {
				t.Fatalf("err = %v, want a death over the message limit", err)
			}
			select {
			case <-k.Done():
			case <-ctx.Done():
				t.Fatal("kernel not stopped")
			}
		})
	}
}

// A message other than output over the limit (an error whose value is
// 2 MiB) still stops the kernel: nothing can be cut of it.
func TestKernelOverTheMessageLimitIsStopped(t *testing.T) {
	k := startLimited(t, Config{MaxFrame: 1 << 20, KeepOutput: 64 << 10})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := k.Execute(ctx, "print('small' * 100_000)", nil); err != nil {
		t.Fatalf("output over the limit: %v", err)
	}
	_, err := k.Execute(ctx, "raise ValueError('x' * (2 << 20))", nil)
	var died *DiedError
	if !errors.As(err, &died) || !strings.Contains(died.Reason, "over the size limit") {
		t.Fatalf("err = %v, want a death over the message limit", err)
	}
	select {
	case <-k.Done():
	case <-ctx.Done():
		t.Fatal("kernel not stopped")
	}
}

// The cut keeps valid JSON whatever the bytes at its edges: escapes and
// multi-byte characters are never split.
func TestCutContentEdges(t *testing.T) {
	for _, unit := range []string{`y`, `\n`, `\u00e9`, `é`, `😀`, `\\`, `\"`, `ab\u2028`} {
		for _, size := range []int{10000, 10001, 10002, 10003, 20011} {
			text := strings.Repeat(unit, size/len(unit)+1)
			content := []byte(`{"name": "stdout", "text": "` + text + `"}`)
			got, dropped := cutBytes(t, content, minCutContent)
			var sc struct{ Name, Text string }
			if err := json.Unmarshal(got, &sc); err != nil {
				t.Fatalf("unit %q size %d: invalid JSON kept: %v", unit, size, err)
			}
			if sc.Name != "stdout" || !strings.Contains(sc.Text, TruncationMarker(dropped)) || len(got) > minCutContent+markerRoom {
				t.Fatalf("unit %q size %d: kept %q", unit, size, got)
			}
		}
	}
	// Two big strings: the dropped bytes span both, only the marker stays.
	got, _ := cutBytes(t, []byte(`{"data": {"text/plain": "`+strings.Repeat("a", 5000)+`", "text/html": "`+strings.Repeat("b", 5000)+`"}, "metadata": {}}`), minCutContent)
	if !bytes.Contains(got, []byte("output truncated")) || bytes.Contains(got, []byte("aaa")) {
		t.Fatalf("kept %q", got)
	}
}

// cutBytes cuts content to budget as cutContent does over a connection.
func cutBytes(t *testing.T, content []byte, budget uint64) ([]byte, int64) {
	t.Helper()
	typ := StreamMsg
	if bytes.Contains(content, []byte(`"data"`)) {
		typ = DisplayData
	}
	s := &socket{conn: fakeConn{bytes.NewReader(content)}}
	got, dropped, err := s.cutContent(uint64(len(content)), budget, typ, nil)
	if err != nil {
		t.Fatal(err)
	}
	return got, dropped
}

// fakeConn is a connection that reads r.
type fakeConn struct {
	r io.Reader
}

func (c fakeConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c fakeConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c fakeConn) Close() error                     { return nil }
func (c fakeConn) LocalAddr() net.Addr              { return nil }
func (c fakeConn) RemoteAddr() net.Addr             { return nil }
func (c fakeConn) SetDeadline(time.Time) error      { return nil }
func (c fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (c fakeConn) SetWriteDeadline(time.Time) error { return nil }

// zmtpMessage is the ZMTP frames of one message.
func zmtpMessage(frames [][]byte) []byte {
	var b []byte
	for i, f := range frames {
		var flag byte
		if i < len(frames)-1 {
			flag = flagMore
		}
		b = appendFrameHeader(b, flag, len(f))
		b = append(b, f...)
	}
	return b
}

// The signature of a cut message covers every byte, those dropped too: a
// message changed in the part that is not kept is refused, and the
// connection reads on. (No real kernel signs wrongly: this corner needs
// hand-made frames.)
func TestCutMessageSignatureCoversDroppedBytes(t *testing.T) {
	signer, err := NewSigner("hmac-sha256", []byte("key"), 0)
	if err != nil {
		t.Fatal(err)
	}
	wire := func(tamper bool) []byte {
		m, err := NewMessage("s", StreamMsg, map[string]string{"name": "stdout", "text": strings.Repeat("y", 1<<20)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		frames := Encode(m, signer)
		if tamper {
			frames[5] = bytes.Clone(frames[5])
			frames[5][len(frames[5])/2] = 'z'
		}
		return zmtpMessage(frames)
	}
	stream := append(append(wire(false), wire(true)...), wire(false)...)
	s := &socket{conn: fakeConn{bytes.NewReader(stream)}, lim: readLimits{keep: 64 << 10, signer: signer}.fill()}
	for i, want := range []error{nil, ErrInvalidSignature, nil} {
		frames, cut, err := s.recvCut()
		if err != nil || cut == nil {
			t.Fatalf("message %d: cut %v, err %v", i, cut, err)
		}
		m, err := decodeCut(frames, cut)
		if !errors.Is(err, want) {
			t.Fatalf("message %d: err %v, want %v", i, err, want)
		}
		if err == nil && (m.Cut < 1<<20-64<<10 || m.Size() > 64<<10+markerRoom+200) {
			t.Fatalf("message %d: kept %d bytes, cut %d", i, m.Size(), m.Cut)
		}
	}
}

// Deno's kernel writes its JSON compactly and in its own order: its
// oversized output is cut the same way.
func TestOversizedDenoOutputIsCut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	k, err := Start(ctx, testProvisioner(t), Config{Spec: testkernels.Spec(t, "deno"), MaxFrame: 16 << 20, KeepOutput: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Shutdown(context.Background())
	if _, err := k.Execute(ctx, "globalThis.survivor = 5", nil); err != nil {
		t.Fatal(err)
	}
	c := newCollector()
	if _, err := k.Execute(ctx, "console.log('start' + 'y'.repeat(50_000_000) + 'end')", c.handle); err != nil {
		t.Fatal(err)
	}
	// Deno may publish its output after its idle status.
	deadline := time.After(30 * time.Second)
	for len(c.ofType(StreamMsg)) == 0 {
		select {
		case <-c.more:
		case <-deadline:
			t.Fatal("no stream message")
		}
	}
	text, cut := streamText(t, c)
	if !strings.HasPrefix(text, "startyyy") || !strings.HasSuffix(text, "yyyend\n") || !strings.Contains(text, TruncationMarker(cut)) || cut < 48_000_000 {
		t.Fatalf("kept %d bytes, cut %d: %.20q … %q", len(text), cut, text, text[max(0, len(text)-20):])
	}
	c = newCollector()
	if _, err := k.Execute(ctx, "console.log(survivor)", c.handle); err != nil {
		t.Fatal(err)
	}
	// As above: its output may come after its idle status.
	deadline = time.After(30 * time.Second)
	for len(c.ofType(StreamMsg)) == 0 {
		select {
		case <-c.more:
		case <-deadline:
			t.Fatal("no stream message after the big output")
		}
	}
	if text, _ := streamText(t, c); text != "5\n" {
		t.Fatalf("state after the big output: %q", text)
	}
}

// A content a little over a budget below the least cut is kept whole: the
// cut never reads past the frame.
func TestCutContentSmallBudget(t *testing.T) {
	content := []byte(`{"name": "stdout", "text": "` + strings.Repeat("y", 3000) + `"}`)
	s := &socket{conn: fakeConn{bytes.NewReader(append(bytes.Clone(content), "next"...))}}
	got, dropped, err := s.cutContent(uint64(len(content)), 100, StreamMsg, nil)
	if err != nil || dropped != 0 || !bytes.Equal(got, content) {
		t.Fatalf("kept %d of %d bytes, dropped %d, err %v", len(got), len(content), dropped, err)
	}
}

// Buffers past the limit are dropped, an empty frame kept in their place,
// whatever their order.
func TestCutDropsBuffersPastTheLimit(t *testing.T) {
	signer, _ := NewSigner("hmac-sha256", []byte("key"), 0)
	m, _ := NewMessage("s", DisplayData, map[string]any{"data": map[string]string{"text/plain": "x"}, "metadata": map[string]any{}}, nil)
	m.Buffers = [][]byte{{}, bytes.Repeat([]byte{1}, 100<<10), {2}, bytes.Repeat([]byte{3}, 10<<10)}
	s := &socket{conn: fakeConn{bytes.NewReader(zmtpMessage(Encode(m, signer)))}, lim: readLimits{keep: 64 << 10, signer: signer}.fill()}
	frames, cut, err := s.recvCut()
	if err != nil || cut == nil {
		t.Fatalf("cut %v, err %v", cut, err)
	}
	got, err := decodeCut(frames, cut)
	if err != nil {
		t.Fatal(err)
	}
	sizes := []int{}
	for _, b := range got.Buffers {
		sizes = append(sizes, len(b))
	}
	if fmt.Sprint(sizes) != "[0 0 1 10240]" || got.Cut != 100<<10 {
		t.Fatalf("buffers %v, cut %d", sizes, got.Cut)
	}
}
