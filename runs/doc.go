// Package runs owns a run of code: its queue (a context's runs, one at a
// time in arrival order), the execute_request it sends and the messages
// that answer it, folded into its events and its Execution, their JSON,
// its end, and its record in the store; after a restart of the gateway it
// reads a run back from its record and follows one its kernel still runs
// to its end. It also holds the bounded outbox a client of a kernel reads
// from.
//
// It knows a kernel only through the small interfaces its queue's Host
// hands it (Kernel; Followed for a run picked up), and the store only
// through Store: it never imports sessions, and knows nothing of how
// kernels are started, restarted or found again.
package runs
