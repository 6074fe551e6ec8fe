package e2b

import (
	"testing"

	"kernelgate/workspace"
)

// A listing names each entry's type as the SDK maps it: a FIFO, socket
// or device is not called a file, which reading it would deny.
func TestRPCEntryTypes(t *testing.T) {
	for _, c := range []struct{ typ, want, perm string }{
		{"file", "FILE_TYPE_FILE", "-rw-r--r--"},
		{"dir", "FILE_TYPE_DIRECTORY", "drwxr-xr-x"},
		{"symlink", "FILE_TYPE_SYMLINK", "lrwxrwxrwx"},
		{"fifo", "FILE_TYPE_UNSPECIFIED", "prw-r--r--"},
		{"socket", "FILE_TYPE_UNSPECIFIED", "srw-r--r--"},
		{"device", "FILE_TYPE_UNSPECIFIED", "crw-r--r--"},
	} {
		e := rpcEntry(workspace.Entry{Name: "x", Path: "x", Type: c.typ})
		if e.Type != c.want || e.Permissions != c.perm {
			t.Errorf("%s: type %s, permissions %s; want %s, %s", c.typ, e.Type, e.Permissions, c.want, c.perm)
		}
	}
}
