package sessions

import "runtime"

// Resources is what one kernel may use.
type Resources struct {
	// CPUs is how many CPUs its processes may run on: those the gateway
	// may run on (a kernel inherits its CPU affinity).
	CPUs int
	// MemoryBytes is its memory limit (--kernel-memory, or its
	// kernelspec's metadata.kernelgate.memory) or, without one, the
	// machine's memory; 0 when neither is known.
	MemoryBytes int64
}

// Resources returns what a kernel of language may use.
func (cat *Catalog) Resources(language string) (Resources, error) {
	spec, err := cat.languageSpec(language)
	if err != nil {
		return Resources{}, err
	}
	limits, _, err := cat.isolation(spec)
	if err != nil {
		return Resources{}, errorf(ErrKernelStart, "%v", err)
	}
	r := Resources{CPUs: runtime.NumCPU(), MemoryBytes: limits.MemoryBytes}
	if r.MemoryBytes == 0 {
		r.MemoryBytes = machineMemory()
	}
	return r, nil
}
