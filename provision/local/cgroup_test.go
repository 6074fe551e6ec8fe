package local

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestCgroupCandidates(t *testing.T) {
	cases := []struct {
		name string
		m    mount
		own  string
		ok   bool
		want []string
	}{
		{"own cgroup below the root", mount{root: "/", point: "/sys/fs/cgroup/memory"}, "/process_api/abc", true,
			[]string{"/sys/fs/cgroup/memory/process_api/abc", "/sys/fs/cgroup/memory"}},
		{"gateway at the root", mount{root: "/", point: "/sys/fs/cgroup/pids"}, "/", true, []string{"/sys/fs/cgroup/pids"}},
		{"mount of a subtree", mount{root: "/docker/x", point: "/sys/fs/cgroup"}, "/docker/x/svc", true,
			[]string{"/sys/fs/cgroup/svc", "/sys/fs/cgroup"}},
		{"own cgroup outside the mount", mount{root: "/docker/x", point: "/sys/fs/cgroup"}, "/other", true, []string{"/sys/fs/cgroup"}},
		{"not in /proc/self/cgroup", mount{root: "/", point: "/sys/fs/cgroup"}, "", false, []string{"/sys/fs/cgroup"}},
	}
	for _, c := range cases {
		if got := candidates(c.m, c.own, c.ok); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: candidates = %q, want %q", c.name, got, c.want)
		}
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/plain`: "/plain", `/tab\011x`: "/tab\tx", `/short\04`: `/short\04`} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestStatValue(t *testing.T) {
	p := filepath.Join(t.TempDir(), "memory.oom_control")
	os.WriteFile(p, []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"), 0o600)
	for key, want := range map[string]int{"oom_kill": 3, "under_oom": 0, "missing": 0} {
		if got := statValue(p, key); got != want {
			t.Errorf("statValue(%s) = %d, want %d", key, got, want)
		}
	}
}
