package main

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kernelgate/forward"
)

// TestConfigClusterSecret: the cluster secret comes from its file or the
// environment, trimmed, at least 32 bytes, given once, and is never in
// an error message.
func TestConfigClusterSecret(t *testing.T) {
	const secret = "a-cluster-secret-of-forty-bytes-01234567"
	dir := t.TempDir()
	file := filepath.Join(dir, "secret")
	os.WriteFile(file, []byte("\n"+secret+"\n"), 0o600)
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("too-short-secret-too-short"), 0o600)
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    bool // a secret is set
		wantErr string
	}{
		{"none", nil, nil, false, ""},
		{"file", []string{"--cluster-secret-file", file}, nil, true, ""},
		{"file from env", nil, map[string]string{"KERNELGATE_CLUSTER_SECRET_FILE": file}, true, ""},
		{"secret in env", nil, map[string]string{"KERNELGATE_CLUSTER_SECRET": "  " + secret + " "}, true, ""},
		{"both", []string{"--cluster-secret-file", file}, map[string]string{"KERNELGATE_CLUSTER_SECRET": secret}, false, "not both"},
		{"short file", []string{"--cluster-secret-file", short}, nil, false, "too short"},
		{"short env", nil, map[string]string{"KERNELGATE_CLUSTER_SECRET": "too-short-secret-too-short"}, false, "too short"},
		{"missing file", []string{"--cluster-secret-file", filepath.Join(dir, "nope")}, nil, false, "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseConfig(tt.args, func(k string) string { return tt.env[k] }, &bytes.Buffer{})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "too-short-secret") {
					t.Fatalf("the error shows the secret: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (c.ClusterSecret != nil) != tt.want {
				t.Fatalf("secret set: %v, want %v", c.ClusterSecret != nil, tt.want)
			}
			if c.ClusterSecret == nil {
				return
			}
			// The secret read is the trimmed one: it verifies what the
			// bare secret signs.
			bare, _ := forward.NewSecret([]byte(secret))
			r, _ := http.NewRequest("GET", "http://h/api/status", nil)
			bare.Sign(r.Header, "GET", "/api/status", []byte("p"), time.Now())
			if _, err := c.ClusterSecret.Verify(r, time.Now()); err != nil {
				t.Fatalf("the configured secret is not the trimmed one: %v", err)
			}
		})
	}
}
