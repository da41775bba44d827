// Command corral-agent runs as PID 1 inside every container sandbox and serves the edge's
// requests (exec, files, tar) on an inherited listening unix socket; see internal/agentrpc.
//
// Usage:
//
//	corral-agent serve [--fd 3]                 serve on the listening socket at fd (default 3)
//	corral-agent serve --stdio                  serve on stdin and stdout instead (a gVisor sandbox)
//	corral-agent serve --calls ...              run fncalls only (see internal/agentrpc/calls.go)
//	corral-agent vm                             in a vm sandbox's guest: serve on its virtio-serial
//	                                            port with the host's config (internal/vmguest)
//	corral-agent hold                           on the host: hold a gVisor sandbox's link (below)
//	corral-agent userns-init                    on the host: holds a sandbox's new user namespace
//	                                            (internal/usernsinit)
//	corral-agent version
//
// With --calls the sandbox gives the agent CAP_SYS_ADMIN, which it uses to isolate each call; it
// then refuses plain commands (they would inherit the capability), and, for each call, re-executes
// itself as `corral-agent call-init`: the call's helper, which only the agent starts (as PID 1 of
// a new PID namespace). Conversely an agent that is PID 1 with CAP_SYS_ADMIN refuses to serve
// without --calls.
//
// In a microvm sandbox the agent is the VM's init: the kernel runs it as /init of the initramfs
// (PID 1, no arguments), and internal/vmguest prepares the VM, reads the serve arguments from the
// host's config and serves on the VM's virtio-serial port (internal/vmlink) instead of a socket.
//
// On runc the edge starts it with the socket on fd 3 and, optionally, the agent's own binary on
// fd 4 (closed at once, so nothing in the sandbox can reach it through /proc/1/fd). On gVisor,
// which cannot accept on an inherited host socket, the agent serves with --stdio: its stdin and
// stdout are pipes to the host, carrying one vmlink session (yamux over a resynchronized byte
// stream, as a microVM's virtio-serial port does); nothing inside the sandbox has a path to
// them. On the host, `corral-agent hold` (run by the runtime from its copy of this binary, in
// its own session, one per gVisor sandbox) holds the pipes' other ends and serves them on a
// host-only unix socket, one client at a time, as QEMU's chardev server does (vmlink.Hold): it
// inherits the listening socket on fd 3, the read end of the agent's stdout on fd 4 and the
// write end of its stdin on fd 5, and exits when the sandbox's end closes. The agent writes
// nothing inside the sandbox: no logs, no files; only a fatal startup error goes to stderr.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/rlimitenv"
	"github.com/corral-dev/corral/internal/seccompbpf"
	"github.com/corral-dev/corral/internal/usernsinit"
	"github.com/corral-dev/corral/internal/vmguest"
	"github.com/corral-dev/corral/internal/vmlink"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// binaryFD is where the edge may pass the agent's own binary.
const binaryFD = 4

func main() {
	// A runc sandbox's rlimits, where runc could not set them (internal/rlimitenv): in force
	// before anything of the sandbox's runs, or the agent does not run.
	if err := rlimitenv.ApplyFromEnv(); err != nil {
		fmt.Fprintf(os.Stderr, "corral-agent: %v\n", err)
		os.Exit(1)
	}
	// A runc sandbox's seccomp profile, compiled on the host, comes in the environment: it is
	// in force on every thread of the agent before anything else runs, or the agent does not
	// run (internal/seccompbpf).
	if err := seccompbpf.InstallFromEnv(); err != nil {
		fmt.Fprintf(os.Stderr, "corral-agent: %v\n", err)
		os.Exit(1)
	}
	if os.Getpid() == 1 && len(os.Args) > 0 && os.Args[0] == "/init" {
		vmguest.Init(guestAgent) // powers the VM off when it fails
		os.Exit(1)
	}
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
	case usernsinit.HelperCmd:
		// On the host, for the runc runtime (internal/usernsinit).
		return usernsinit.Main(args, os.Stdin, stdout, stderr)
	case agentrpc.CallInitArg:
		return agentrpc.CallInit()
	case "hold":
		if err := hold(); err != nil {
			fmt.Fprintf(stderr, "corral-agent hold: %v\n", err)
			return 1
		}
		return 0
	case "vm":
		// In a vm sandbox's guest: a service of its init (internal/vmimage/build.sh installs the unit).
		err := vmguest.Machine(machineAgent)
		fmt.Fprintf(stderr, "corral-agent: %v\n", err)
		return 1
	case "serve":
	default:
		fmt.Fprintf(stderr, "corral-agent: unknown command %q\n", args[0])
		return 2
	}
	o, err := parseServe(args[1:], stderr)
	if err != nil {
		if !errors.Is(err, errUsage) {
			fmt.Fprintf(stderr, "corral-agent: %v\n", err)
		}
		return 2
	}
	if o.claimable {
		fmt.Fprintf(stderr, "corral-agent: %s is for a microvm's agent (the VM's init)\n", agentrpc.ClaimableFlag)
		return 2
	}
	if o.cfg.Calls && os.Getpid() != 1 {
		fmt.Fprintln(stderr, "corral-agent: --calls needs the agent to be PID 1 of the sandbox's PID namespace")
		return 2
	}
	if !o.cfg.Calls && os.Getpid() == 1 && hasSysAdmin() {
		fmt.Fprintln(stderr, "corral-agent: PID 1 with CAP_SYS_ADMIN: start with --calls, or every command would inherit it")
		return 2
	}
	closeBinaryFD()
	listen := func() (net.Listener, error) { return agentrpc.ListenFD(o.fd) }
	if o.stdio {
		open, err := vmlink.TakeStdio()
		if err != nil {
			fmt.Fprintf(stderr, "corral-agent: %v\n", err)
			return 1
		}
		listen = func() (net.Listener, error) { return vmlink.Listen(open, nil), nil }
	}
	if err := serve(ctx, listen, o.cfg); err != nil {
		fmt.Fprintf(stderr, "corral-agent: %v\n", err)
		return 1
	}
	return 0
}

// serveOptions are serve's flags.
type serveOptions struct {
	fd    int
	stdio bool
	// claimable: a microvm's agent in a warm pool (agentrpc.ClaimableFlag).
	claimable bool
	cfg       agentrpc.Config
	args      []string        // left after the flags
	set       map[string]bool // the flags given
}

// errUsage is a usage error that parseServe has already reported (the flag package prints its
// own).
var errUsage = errors.New("usage")

// parseServe parses serve's flags (args after "serve"). The guest's init parses the serve
// arguments the host gave it with the same flags.
func parseServe(args []string, stderr io.Writer) (*serveOptions, error) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &serveOptions{}
	fs.IntVar(&o.fd, "fd", 3, "inherited listening unix socket")
	fs.BoolVar(&o.stdio, "stdio", false, "serve on stdin and stdout (a vmlink session); --fd is then ignored")
	fs.IntVar(&o.cfg.RetainExited, "retain-exited", 0, "exited commands kept for re-attach (default 64)")
	fs.DurationVar(&o.cfg.RetainFor, "retain-for", 0, "how long an exited command is kept for re-attach (default 10m)")
	fs.BoolVar(&o.cfg.Calls, "calls", false, "run fncalls only: every command is a call, isolated in its own namespaces")
	fs.BoolVar(&o.claimable, strings.TrimPrefix(agentrpc.ClaimableFlag, "--"), false, "a microvm's agent in a warm pool: its claim sets the hostname (once)")
	if err := fs.Parse(args); err != nil {
		return nil, errUsage
	}
	o.args = fs.Args()
	o.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	if o.cfg.RetainExited < 0 || o.cfg.RetainFor < 0 {
		return nil, errors.New("--retain-exited and --retain-for must not be negative")
	}
	return o, nil
}

// guestAgent is the agent of a microvm sandbox (vmguest.Agent): args are the serve arguments
// from the host's config. The guest's init drops the capabilities of everything it starts to
// the sandbox's set (plus CAP_SYS_ADMIN with --calls) before it serves, so the CAP_SYS_ADMIN
// check of serve applies unchanged: the agent is PID 1 and, without --calls, no longer holds it.
func guestAgent(args []string) (func(context.Context, net.Listener) error, bool, error) {
	return vmAgent(args, false)
}

// machineAgent is the agent of a vm sandbox (vmguest.Machine): a service of the machine's own
// init, running commands as the machine's root with every capability, since there the machine
// is the sandbox. It runs no fncalls.
func machineAgent(args []string) (func(context.Context, net.Listener) error, bool, error) {
	return vmAgent(args, true)
}

// vmAgent parses the serve arguments a VM's agent gets from the host.
func vmAgent(args []string, machine bool) (func(context.Context, net.Listener) error, bool, error) {
	if len(args) == 0 || args[0] != "serve" {
		return nil, false, fmt.Errorf("want serve and its flags, got %q", args)
	}
	var usage strings.Builder
	o, err := parseServe(args[1:], &usage)
	if errors.Is(err, errUsage) {
		err = fmt.Errorf("bad serve flags: %s", strings.TrimSpace(strings.SplitN(usage.String(), "\n", 2)[0]))
	}
	if err != nil {
		return nil, false, err
	}
	if len(o.args) > 0 {
		return nil, false, fmt.Errorf("serve takes no arguments, got %q", o.args)
	}
	if o.set["fd"] || o.set["stdio"] {
		return nil, false, errors.New("--fd and --stdio do not apply: the agent serves on the virtio-serial port")
	}
	if machine && o.cfg.Calls {
		return nil, false, errors.New("--calls: a vm sandbox runs no fncalls")
	}
	if o.claimable {
		if machine || o.cfg.Calls {
			return nil, false, fmt.Errorf("%s is for a microvm's agent without --calls", agentrpc.ClaimableFlag)
		}
		// The hostname is set once, at the claim, with CAP_SYS_ADMIN raised on a thread of its
		// own: the guest's init keeps it in PID 1's permitted set alone, outside every command's
		// bounding set.
		o.cfg.SetHostname = vmguest.ClaimHostname
	}
	if !machine {
		// A fork's copy of this microvm has the host give it its own address and hostname.
		o.cfg.ForkIdentity = vmguest.ApplyForkIdentity
	}
	return func(ctx context.Context, ln net.Listener) error {
		if !machine && !o.cfg.Calls && hasSysAdmin() {
			ln.Close()
			return errors.New("PID 1 with CAP_SYS_ADMIN: start with --calls, or every command would inherit it")
		}
		return serve(ctx, func() (net.Listener, error) { return ln, nil }, o.cfg)
	}, o.cfg.Calls, nil
}

// serve hardens the agent and serves it on the listener listen returns until ctx ends.
func serve(ctx context.Context, listen func() (net.Listener, error), cfg agentrpc.Config) error {
	// A small, mostly idle heap: collect early rather than grow.
	debug.SetGCPercent(25)
	if err := agentrpc.Harden(ctx); err != nil {
		return err
	}
	// Adopt orphans even when not PID 1 of a PID namespace (e.g. a shared PID namespace).
	unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	ln, err := listen()
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

// hold is `corral-agent hold`: see the package comment.
func hold() error {
	lf := os.NewFile(3, "ctl-listener")
	ln, err := net.FileListener(lf)
	lf.Close()
	if err != nil {
		return fmt.Errorf("listener fd 3: %w", err)
	}
	fromGuest, toGuest := os.NewFile(4, "from-sandbox"), os.NewFile(5, "to-sandbox")
	if fromGuest == nil || toGuest == nil {
		return errors.New("want the sandbox's pipes on fds 4 and 5")
	}
	return vmlink.Hold(ln, fromGuest, toGuest)
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
