// Command kernelgate serves Jupyter kernels over the Jupyter Server REST and
// websocket API and over a code-interpreter API.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"kernelgate/kernelspecs"
)

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	if len(os.Args) < 2 || os.Args[1] != "serve" {
		fmt.Fprintln(os.Stderr, "usage: kernelgate serve [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	var dirs stringList
	fs.Var(&dirs, "kernelspec-dir", "directory of kernelspecs, searched before the Jupyter path (repeatable)")
	fs.Parse(os.Args[2:])
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cat := kernelspecs.Load(kernelspecs.SearchPath(dirs, os.Getenv))
	for _, s := range cat.All() {
		log.Info("kernelspec", "name", s.Name, "language", s.Language, "dir", s.Dir)
	}
	for _, p := range cat.Problems() {
		log.Warn("kernelspec skipped", "path", p.Path, "err", p.Err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
}
