// Command corral-agent runs as PID 1 inside every container sandbox and serves the edge's
// requests (exec, files, tar) on an inherited listening unix socket; see internal/agentrpc.
//
// Usage:
//
//	corral-agent serve [--fd 3]                 serve on the listening socket at fd (default 3)
//	corral-agent serve --listen PATH [--resume-marker PATH]
//	                                            listen on a unix socket at PATH instead
//	corral-agent serve --calls ...              run fncalls only (see internal/agentrpc/calls.go)
//	corral-agent version
//
// With --calls the sandbox gives the agent CAP_SYS_ADMIN, which it uses to isolate each call; it
// then refuses plain commands (they would inherit the capability), and, for each call, re-executes
// itself as `corral-agent call-init`: the call's helper, which only the agent starts (as PID 1 of
// a new PID namespace). Conversely an agent that is PID 1 with CAP_SYS_ADMIN refuses to serve
// without --calls.
//
// On runc the edge starts it with the socket on fd 3 and, optionally, the agent's own binary on
// fd 4 (closed at once, so nothing in the sandbox can reach it through /proc/1/fd). On gVisor,
// which cannot accept on an inherited host socket, the agent listens on a path in a directory the
// host shares with it; with --resume-marker it can be quiesced before a checkpoint and listens
// again once the host creates the marker file (see internal/agentrpc/quiesce.go). The agent
// writes nothing inside the sandbox but that socket: no logs, no files; only a fatal startup
// error goes to stderr.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/agentrpc"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// binaryFD is where the edge may pass the agent's own binary.
const binaryFD = 4

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: corral-agent serve [--fd N] [--calls] | version")
		return 2
	}
	switch args[0] {
	case "version":
		fmt.Fprintln(stdout, version)
		return 0
	case agentrpc.CallInitArg:
		return agentrpc.CallInit()
	case "serve":
	default:
		fmt.Fprintf(stderr, "corral-agent: unknown command %q\n", args[0])
		return 2
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fd := fs.Int("fd", 3, "inherited listening unix socket")
	listen := fs.String("listen", "", "listen on a unix socket at this path instead of --fd")
	marker := fs.String("resume-marker", "", "with --listen: allow quiescing; listen again once this file exists")
	var cfg agentrpc.Config
	fs.IntVar(&cfg.RetainExited, "retain-exited", 0, "exited commands kept for re-attach (default 64)")
	fs.DurationVar(&cfg.RetainFor, "retain-for", 0, "how long an exited command is kept for re-attach (default 10m)")
	fs.BoolVar(&cfg.Calls, "calls", false, "run fncalls only: every command is a call, isolated in its own namespaces")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if cfg.RetainExited < 0 || cfg.RetainFor < 0 {
		fmt.Fprintln(stderr, "corral-agent: --retain-exited and --retain-for must not be negative")
		return 2
	}
	if *marker != "" && *listen == "" {
		fmt.Fprintln(stderr, "corral-agent: --resume-marker needs --listen")
		return 2
	}
	if *marker != "" {
		cfg.Relisten = agentrpc.WaitForMarker(*listen, *marker, 2*time.Millisecond)
	}
	if cfg.Calls && os.Getpid() != 1 {
		fmt.Fprintln(stderr, "corral-agent: --calls needs the agent to be PID 1 of the sandbox's PID namespace")
		return 2
	}
	if !cfg.Calls && os.Getpid() == 1 && hasSysAdmin() {
		fmt.Fprintln(stderr, "corral-agent: PID 1 with CAP_SYS_ADMIN: start with --calls, or every command would inherit it")
		return 2
	}
	if err := serve(ctx, *fd, *listen, cfg); err != nil {
		fmt.Fprintf(stderr, "corral-agent: %v\n", err)
		return 1
	}
	return 0
}

func serve(ctx context.Context, fd int, listen string, cfg agentrpc.Config) error {
	closeBinaryFD()
	// A small, mostly idle heap: collect early rather than grow.
	debug.SetGCPercent(25)
	if err := agentrpc.Harden(ctx); err != nil {
		return err
	}
	// Adopt orphans even when not PID 1 of a PID namespace (e.g. a shared PID namespace).
	unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	var ln net.Listener
	var err error
	if listen != "" {
		ln, err = agentrpc.ListenPath(listen)
	} else {
		ln, err = agentrpc.ListenFD(fd)
	}
	if err != nil {
		return err
	}
	cfg.Version = version
	srv, err := agentrpc.NewServer(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	return srv.Serve(ctx, ln)
}

// hasSysAdmin reports whether CAP_SYS_ADMIN is in this process's effective set.
func hasSysAdmin() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[unix.CAP_SYS_ADMIN/32].Effective&(1<<(unix.CAP_SYS_ADMIN%32)) != 0
}

// closeBinaryFD closes fd 4 when it holds a regular file (the agent's binary passed by the
// host). Checking the type keeps it from closing a descriptor the runtime opened itself.
func closeBinaryFD() {
	var st unix.Stat_t
	if unix.Fstat(binaryFD, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
		unix.Close(binaryFD)
	}
}
