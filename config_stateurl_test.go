package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// TestConfigStateURL: --state-url (or KERNELGATE_STATE_URL) selects
// PostgreSQL; with a state directory other than the default it is
// refused, and no error shows the URL's password.
func TestConfigStateURL(t *testing.T) {
	const url = "postgres://kg:topsecret@db:5432/kg"
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	home := map[string]string{"HOME": "/home/u"}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		err  string // "" when accepted
	}{
		{"flag", []string{"--state-url", url}, home, ""},
		{"env", nil, map[string]string{"HOME": "/home/u", "KERNELGATE_STATE_URL": url}, ""},
		{"default dir given", []string{"--state-url", url, "--state-dir", "/home/u/.local/state/kernelgate"}, home, ""},
		{"other dir", []string{"--state-url", url, "--state-dir", "/srv/kg"}, home, "not both"},
		{"other dir from env", []string{"--state-url", url}, map[string]string{"HOME": "/home/u", "KERNELGATE_STATE_DIR": "/srv/kg"}, "not both"},
		{"memory", []string{"--state-url", url, "--state-dir", ""}, home, "not both"},
		{"not postgres", []string{"--state-url", "mysql://kg:topsecret@db/kg"}, home, "want postgres://"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseConfig(tc.args, env(tc.env), &bytes.Buffer{})
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.err == "" && c.StateURL != url:
				t.Errorf("state URL %q, want %q", c.StateURL, url)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("error %v, want one saying %q", err, tc.err)
			case err != nil && strings.Contains(err.Error(), "topsecret"):
				t.Errorf("the error holds the password: %v", err)
			case err == nil && slices.Contains(c.secretsInArgv, "--state-url") != (tc.name != "env"):
				t.Errorf("a password on the command line is warned of: %v, want %v", c.secretsInArgv, tc.name != "env")
			}
		})
	}
}
