// Package sessions owns kernels by id and everything kept about them:
// their state and activity, the websocket clients attached to them with the
// iopub fan-out and the replay of what they missed, automatic restarts,
// culling, Jupyter sessions, and for the code-interpreter API the contexts,
// run queues and the Executions built from kernel messages.
//
// It must not know HTTP, Echo or websockets: the gateway calls it with
// plain values and maps its errors to status codes.
package sessions
