package sessions

// kind is what the kernel serves, as a provisioner records it
// (jupyter.LaunchRequest.Kind): "jupyter" for a kernel of the Jupyter API,
// which a later gateway may adopt as it is, "context" for a kernel of the
// code-interpreter API (a context's or a warm pool's).
func (k *Kernel) kind() string {
	if k.policy == restartNow {
		return "jupyter"
	}
	return "context"
}
