// Command corral-bench measures Corral against baselines taken in the same run (`make bench`).
// It is a binary of its own so bin/corral links no benchmark or test code; see package
// internal/benchcli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/corral-dev/corral/internal/benchcli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	code := benchcli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
