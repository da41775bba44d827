// Command corral is the Corral command line: it creates and drives sandboxes through the REST
// API, and `corral up` runs the server on this machine. See package internal/cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/corral-dev/corral/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first interrupt, which commands turn into a clean stop (a signal forwarded, a
	// sandbox deleted), the default action returns, so a second one ends corral at once.
	context.AfterFunc(ctx, stop)
	code := cli.Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
