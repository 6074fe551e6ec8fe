package jupyter

import (
	"bytes"
	"testing"
)

// Info of an earlier version kept a provisioner's part under a key named
// as the provisioner; it is read as Data. Info with Data keeps its own.
func TestUnmarshalProvisionerInfoOfEarlierVersion(t *testing.T) {
	for _, c := range []struct {
		name, in, data string
	}{
		{"earlier version", `{"provisioner":"local","connection":{"key":"k"},"local":{"pid":7,"startTime":9}}`, `{"pid":7,"startTime":9}`},
		{"data", `{"provisioner":"local","connection":{"key":"k"},"data":{"pid":8}}`, `{"pid":8}`},
		{"both", `{"provisioner":"local","local":{"pid":7},"data":{"pid":8}}`, `{"pid":8}`},
		{"null", `{"provisioner":"local","local":null}`, ``},
		{"another provisioner's key", `{"provisioner":"kubernetes-provisioner","local":{"pid":7}}`, ``},
	} {
		t.Run(c.name, func(t *testing.T) {
			pi, err := UnmarshalProvisionerInfo([]byte(c.in))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(pi.Data, []byte(c.data)) {
				t.Errorf("Data = %s, want %s", pi.Data, c.data)
			}
			if b, err := pi.Marshal(); err != nil || c.data != "" && !bytes.Contains(b, []byte(`"data":`+c.data)) {
				t.Errorf("Marshal = %s, %v: the data is not kept", b, err)
			}
		})
	}
}
