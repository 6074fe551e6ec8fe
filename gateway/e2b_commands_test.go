//go:build linux

package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// connectStart sends process.Process/Start (or Connect) as the E2B SDK
// does and returns the stream's messages, the end frame last.
func connectStream(t *testing.T, g *testGateway, method string, h map[string]string, msg any) (int, []map[string]any) {
	t.Helper()
	js, _ := json.Marshal(msg)
	var body bytes.Buffer
	body.WriteByte(0)
	binary.Write(&body, binary.BigEndian, uint32(len(js)))
	body.Write(js)
	req, _ := http.NewRequest("POST", g.url+"/e2b/process.Process/"+method, &body)
	req.Header.Set("Content-Type", "application/connect+json")
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, []map[string]any{{"body": string(b)}}
	}
	var out []map[string]any
	for {
		var head [5]byte
		if _, err := io.ReadFull(resp.Body, head[:]); err != nil {
			break
		}
		frame := make([]byte, binary.BigEndian.Uint32(head[1:]))
		io.ReadFull(resp.Body, frame)
		var m map[string]any
		if err := json.Unmarshal(frame, &m); err != nil {
			t.Fatalf("frame %q: %v", frame, err)
		}
		if head[0]&0x02 != 0 {
			m["endStream"] = true
		}
		out = append(out, m)
	}
	return resp.StatusCode, out
}

// TestE2BProcessService: envd's process RPCs as the SDK frames them, a
// sandbox's commands out of another sandbox's reach, and what is not
// served (a pty) refused with Connect's codes.
func TestE2BProcessService(t *testing.T) {
	g := newGateway(t)
	id, tok := e2bSandbox(t, g, `{}`)
	h := map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": tok}
	status, frames := connectStream(t, g, "Start", h, map[string]any{"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-l", "-c", "printf 'a\\xc3\\xa9'; exit 2"}}, "stdin": false})
	if status != 200 || len(frames) < 3 {
		t.Fatalf("Start: %d %v", status, frames)
	}
	if ev, _ := frames[0]["event"].(map[string]any); ev["start"] == nil {
		t.Errorf("first frame %v", frames[0])
	}
	var out strings.Builder
	var end map[string]any
	for _, f := range frames[1:] {
		ev, _ := f["event"].(map[string]any)
		if d, ok := ev["data"].(map[string]any); ok {
			var b []byte
			b, _ = base64Decode(d["stdout"].(string))
			out.Write(b)
		}
		if e, ok := ev["end"].(map[string]any); ok {
			end = e
		}
	}
	if last := frames[len(frames)-1]; last["endStream"] != true || last["error"] != nil {
		t.Errorf("last frame %v", last)
	}
	if out.String() != "aé" || end["exitCode"] != 2.0 || end["status"] != "exit status 2" {
		t.Errorf("output %q, end %v", out.String(), end)
	}

	// Another sandbox neither lists, nor signals, nor reads this one's command.
	id2, tok2 := e2bSandbox(t, g, `{}`)
	h2 := map[string]string{"E2b-Sandbox-Id": id2, "X-Access-Token": tok2, "Authorization": "token " + g.token}
	// A client that goes away leaves its command running, as envd does.
	ctx, cancel := context.WithCancel(context.Background())
	js, _ := json.Marshal(map[string]any{"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-c", "sleep 300"}}})
	req, _ := http.NewRequestWithContext(ctx, "POST", g.url+"/e2b/process.Process/Start", bytes.NewReader(append([]byte{0, 0, 0, 0, byte(len(js))}, js...)))
	req.Header.Set("Content-Type", "application/connect+json")
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("Start: %v %v", err, resp)
	}
	head := make([]byte, 5)
	io.ReadFull(resp.Body, head)
	cancel()
	resp.Body.Close()
	var pid float64
	checkFor(t, 30*time.Second, "the sleep to be listed", func() bool {
		status, out := g.doWith("POST", "/e2b/process.Process/List", map[string]any{}, map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": tok})
		var l struct {
			Processes []struct {
				Pid    float64 `json:"pid"`
				Config struct {
					Args []string `json:"args"`
				} `json:"config"`
			} `json:"processes"`
		}
		json.Unmarshal(out, &l)
		if status == 200 && len(l.Processes) == 1 && strings.Join(l.Processes[0].Config.Args, " ") == "-c sleep 300" {
			pid = l.Processes[0].Pid
			return true
		}
		return false
	})
	status, out2 := g.doWith("POST", "/e2b/process.Process/List", map[string]any{}, h2)
	if status != 200 || strings.Contains(string(out2), "sleep") {
		t.Errorf("the other sandbox lists %d %s", status, out2)
	}
	sig := map[string]any{"process": map[string]any{"pid": pid}, "signal": "SIGNAL_SIGKILL"}
	if status, out := g.doWith("POST", "/e2b/process.Process/SendSignal", sig, h2); status != 404 || !strings.Contains(string(out), "not_found") {
		t.Errorf("the other sandbox's SendSignal: %d %s", status, out)
	}
	if status, _ := connectStream(t, g, "Connect", h2, map[string]any{"process": map[string]any{"pid": pid}}); status != 404 {
		t.Errorf("the other sandbox's Connect: %d", status)
	}
	if status, out := g.doWith("POST", "/e2b/process.Process/SendSignal", sig, map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": tok2}); status != 401 {
		t.Errorf("SendSignal with the other sandbox's token: %d %s", status, out)
	}
	if status, out := g.doWith("POST", "/e2b/process.Process/SendSignal", sig, map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": tok}); status != 200 {
		t.Errorf("SendSignal: %d %s", status, out)
	}
	checkFor(t, 30*time.Second, "the killed sleep to leave the list", func() bool {
		_, out := g.doWith("POST", "/e2b/process.Process/List", map[string]any{}, map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": tok})
		return string(out) == `{"processes":[]}`+"\n" || string(out) == `{"processes":[]}`
	})
	if status, frames := connectStream(t, g, "Start", h, map[string]any{"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-i", "-l"}}, "pty": map[string]any{"size": map[string]int{"cols": 80, "rows": 24}}}); status != 501 || !strings.Contains(frames[0]["body"].(string), "unimplemented") {
		t.Errorf("a pty: %d %v", status, frames)
	}
}

func base64Decode(s string) ([]byte, error) { return base64.StdEncoding.DecodeString(s) }
