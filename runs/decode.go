package runs

import (
	"encoding/json"
	"strconv"

	"kernelgate/internal/jsonscan"
	"kernelgate/jupyter"
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
// left to encoding/json, which merges the two objects into one, and so
// is a member it would take regardless of case.
func readDisplay(raw []byte, c *displayContent) bool {
	var f [4][]byte // Each's values are never nil: nil is absent
	plain := true
	ok := jsonscan.Each(raw, func(k, v []byte) {
		switch i, exact := jsonscan.Lookup(k, displayKeys); {
		case !exact, i >= 0 && i < 3 && f[i] != nil:
			plain = false
		case i >= 0:
			f[i] = v
		}
	})
	if ok && plain && readDisplayMembers(f, c) {
		return true
	}
	*c = displayContent{}
	return false
}

// decodeDisplay reads m's display content into c, with encoding/json
// when readDisplay leaves it.
func decodeDisplay(m *jupyter.Message, c *displayContent) bool {
	return readDisplay(m.RawContent, c) || m.DecodeContent(c) == nil
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
