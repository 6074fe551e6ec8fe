// Package jupyter is a client of the Jupyter messaging protocol: it starts
// kernels through a Provisioner, talks to them over ZeroMQ, routes every
// message to the request it answers, interrupts, restarts and reaps them.
//
// It owns the wire codec (wire.go, signer.go), connection info
// (conninfo.go), the Provisioner interface and its Registry
// (provisioner.go, provisioners.go, provinfo.go), the contract of commands
// beside a kernel (command.go), the channel sockets (channels.go, zmtp.go)
// and the life of one kernel process (kernel.go, connect.go).
//
// It names no provisioner: what differs between them (limits, sandboxes,
// how a kernel is signalled, why it ended, whether a start is retried,
// what is kept to find it again) goes through the Provisioner and Process
// interfaces. The provisioners are in provision/ (local, kubernetes).
//
// It must not know HTTP, websockets, contexts or sessions: callers above it
// see Messages with raw JSON parts, never frames, keys or sockets. It
// speaks ZMTP itself (zmtp.go, channels.go); zmq4 serves only as a peer in
// its tests.
package jupyter
