//go:build !unix

package pgtest

import "os/exec"

// runAs is never needed where there is no root: Launch asks for another
// user only when running as uid 0.
func runAs(*exec.Cmd, ids) {}
