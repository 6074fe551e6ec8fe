// Package gateway serves kernelgate over HTTP with Echo: the Jupyter
// Server compatible REST API and kernel websocket, the code-interpreter
// API, authentication, and the one table that maps errors to status codes.
//
// It must not know ZeroMQ, wire frames, HMAC keys or processes: it speaks
// to package sessions with plain values and raw JSON message parts.
package gateway
