package sessions

import (
	"encoding/json"
	"strconv"
	"strings"

	"kernelgate/internal/jsonscan"
)

// Readers of the contents every run gets (results, execute_input, the
// reply) that skip encoding/json's reflection. Each reads only what
// jsonscan reads exactly as encoding/json would and reports false for
// anything else: the caller then decodes with encoding/json, so what a
// run records never depends on which of the two read it.

var (
	displayKeys   = []string{"data", "metadata", "transient", "execution_count"}
	displayIDKeys = []string{"display_id"}
	countKeys     = []string{"execution_count"}
	replyKeys     = []string{"status", "execution_count", "ename", "evalue", "traceback"}
)

// readDisplay reads a display_data, update_display_data or
// execute_result content into c; on false c is left empty. The bundle's
// raw values share raw. A repeated data, metadata or transient member is
// left to encoding/json, which merges the two objects into one.
func readDisplay(raw []byte, c *displayContent) bool {
	var f [4][]byte
	seen := 0
	ok := jsonscan.Each(raw, func(k, v []byte) {
		for i, name := range displayKeys {
			switch {
			case string(k) == name:
				if i < 3 && seen&(1<<i) != 0 {
					seen = -1
				}
				if seen >= 0 {
					seen |= 1 << i
				}
				f[i] = v
				return
			case strings.EqualFold(string(k), name):
				seen = -1
				return
			}
		}
	})
	if ok && seen >= 0 && readDisplayMembers(f, c) {
		return true
	}
	*c = displayContent{}
	return false
}

// readDisplayMembers reads the raw members data, metadata, transient and
// execution_count (nil: absent) into c.
func readDisplayMembers(f [4][]byte, c *displayContent) bool {
	var ok bool
	if c.Data, ok = readBundle(f[0]); !ok {
		return false
	}
	if c.Metadata, ok = readBundle(f[1]); !ok {
		return false
	}
	if f[2] != nil && !isNull(f[2]) {
		var id [1][]byte
		if !jsonscan.Members(f[2], displayIDKeys, id[:]) {
			return false
		}
		if id[0] != nil && !isNull(id[0]) {
			s, _, ok := jsonscan.PlainString(id[0], 0)
			if !ok {
				return false
			}
			c.Transient.DisplayID = string(s)
		}
	}
	c.ExecutionCount, ok = readCount(f[3])
	return ok
}

// readBundle reads a MIME bundle (or metadata) object: nil for none or
// null.
func readBundle(raw []byte) (map[string]json.RawMessage, bool) {
	if raw == nil || isNull(raw) {
		return nil, true
	}
	m := make(map[string]json.RawMessage, 2)
	ok := jsonscan.Each(raw, func(k, v []byte) { m[string(k)] = v })
	return m, ok
}

// readCount reads an execution_count: nil for none or null.
func readCount(raw []byte) (*int, bool) {
	if raw == nil || isNull(raw) {
		return nil, true
	}
	n, err := strconv.Atoi(string(raw))
	if err != nil {
		return nil, false
	}
	return &n, true
}

// readInputCount reads an execute_input's execution_count.
func readInputCount(raw []byte) (*int, bool) {
	var f [1][]byte
	if !jsonscan.Members(raw, countKeys, f[:]) {
		return nil, false
	}
	return readCount(f[0])
}

// readReply reads an execute_reply without an error: its status and
// execution count. A reply with an error's fields is left to
// encoding/json.
func readReply(raw []byte) (status string, count *int, ok bool) {
	var f [5][]byte
	if !jsonscan.Members(raw, replyKeys, f[:]) || f[2] != nil || f[3] != nil || f[4] != nil {
		return "", nil, false
	}
	if f[0] != nil && !isNull(f[0]) {
		s, _, ok := jsonscan.PlainString(f[0], 0)
		if !ok {
			return "", nil, false
		}
		status = string(s)
	}
	count, ok = readCount(f[1])
	return status, count, ok
}

func isNull(raw []byte) bool { return string(raw) == "null" }
