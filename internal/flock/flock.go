// Package flock takes the non-waiting file locks that say a
// process owns a folder (the state directory, a workspace root), or shares
// it with its peers (replicas on one workspace root): the lock
// ends with the file's close or the process, however it ends, so a
// process killed with SIGKILL leaves no stale lock.
package flock
