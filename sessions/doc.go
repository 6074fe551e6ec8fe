// Package sessions owns kernels by id and everything kept about them:
// their state and activity, the websocket clients attached to them with the
// iopub fan-out and the replay of what they missed, automatic restarts,
// culling, Jupyter sessions, warm pools, and for the code-interpreter API
// the contexts, each of which hands its queue of runs (package runs) its
// kernel. A run's queue, its messages, events, Execution and record are
// package runs'.
//
// It must not know HTTP, Echo or websockets: the gateway calls it with
// plain values and maps its errors to status codes.
package sessions
