package jupyter

import (
	"encoding/json"

	"kernelgate/internal/jsonscan"
)

// Every message that passes through kernelgate has its header and parent
// header parsed for routing, and every status message its
// execution_state. Kernels write these as small flat objects of plain
// strings, which jsonscan.Strings reads several times faster than
// encoding/json. Anything else (an escape in a string, a number, a nested
// value, a key that differs from a wanted one only in case, a member of
// the wrong type) makes it give up, and the caller decodes with
// encoding/json, so the result is always what encoding/json gives.

// decodeFlat decodes b into *v: with jsonscan.Strings into dst (fields of *v,
// named keys) when it can, else with encoding/json into a zeroed *v.
func decodeFlat[T any](b []byte, v *T, keys []string, dst []*string) error {
	if jsonscan.Strings(b, keys, dst) {
		return nil
	}
	var zero T
	*v = zero
	return json.Unmarshal(b, v)
}
