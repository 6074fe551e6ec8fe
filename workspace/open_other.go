//go:build !unix

package workspace

// readFlags are added to every open of a file to read; there is no FIFO
// to block on here.
const readFlags = 0
