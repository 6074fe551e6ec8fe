package gateway

import (
	"net/http"
	"testing"
	"time"

	"kernelgate/sessions"
)

func TestKernelLifecycleREST(t *testing.T) {
	g := newGateway(t)
	status, body := g.doWith("GET", "/api", nil, nil)
	if status != 200 || decode[map[string]string](t, body)["version"] == "" {
		t.Fatalf("GET /api without token: %d %s", status, body)
	}
	status, body = g.do("GET", "/api/kernelspecs?1480636982374", nil)
	specs := decode[struct {
		Default     string                     `json:"default"`
		Kernelspecs map[string]kernelspecModel `json:"kernelspecs"`
	}](t, body)
	if status != 200 || specs.Default != "python3" || specs.Kernelspecs["deno"].Spec.Language != "typescript" {
		t.Fatalf("kernelspecs: %d %s", status, body)
	}
	if logo := specs.Kernelspecs["python3"].Resources["logo-64x64"]; logo != "/kernelspecs/python3/logo-64x64.png" {
		t.Errorf("logo resource = %q", logo)
	} else if st, png := g.do("GET", logo, nil); st != 200 || len(png) < 100 {
		t.Errorf("GET %s: %d", logo, st)
	}

	status, body = g.do("POST", "/api/kernels", map[string]string{"name": "python3"})
	if status != http.StatusCreated {
		t.Fatalf("POST: %d %s", status, body)
	}
	k := decode[sessions.KernelModel](t, body)
	if k.Name != "python3" || k.ID == "" {
		t.Fatalf("model %+v", k)
	}
	if _, err := time.Parse("2006-01-02T15:04:05.000000Z", k.LastActivity); err != nil {
		t.Errorf("last_activity %q: %v", k.LastActivity, err)
	}
	status, body = g.do("GET", "/api/kernels", nil)
	if list := decode[[]sessions.KernelModel](t, body); status != 200 || len(list) != 1 || list[0].ID != k.ID {
		t.Errorf("list: %d %s", status, body)
	}
	if status, _ = g.do("GET", "/api/kernels/"+k.ID, nil); status != 200 {
		t.Errorf("get: %d", status)
	}
	if status, body = g.do("POST", "/api/kernels/"+k.ID+"/interrupt", map[string]any{}); status != http.StatusNoContent {
		t.Errorf("interrupt: %d %s", status, body)
	}
	if status, body = g.do("POST", "/api/kernels/"+k.ID+"/restart", map[string]any{}); status != 200 || decode[sessions.KernelModel](t, body).ID != k.ID {
		t.Errorf("restart: %d %s", status, body)
	}
	if status, _ = g.do("DELETE", "/api/kernels/"+k.ID, nil); status != http.StatusNoContent {
		t.Errorf("delete: %d", status)
	}
	status, body = g.do("GET", "/api/kernels/"+k.ID, nil)
	if status != 404 || decode[map[string]any](t, body)["message"] == nil {
		t.Errorf("get after delete: %d %s", status, body)
	}
}
