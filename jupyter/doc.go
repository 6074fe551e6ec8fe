// Package jupyter is a client of the Jupyter messaging protocol: it starts
// kernels through a Provisioner, talks to them over ZeroMQ, routes every
// message to the request it answers, interrupts, restarts and reaps them.
//
// It owns the wire codec (wire.go, signer.go), connection info
// (conninfo.go), launching (provisioner.go, local.go), the channel sockets
// (channels.go, zmtp.go) and the life of one kernel process (kernel.go).
//
// It must not know HTTP, websockets, contexts or sessions: callers above it
// see Messages with raw JSON parts, never frames, keys or sockets. It
// speaks ZMTP itself (zmtp.go, channels.go); zmq4 serves only as a peer in
// its tests.
package jupyter
