// corral-runcd starts runc containers for Corral's runc runtime with runc's own libcontainer,
// in one long-lived process instead of a `runc run --detach` per container (internal/runcd has
// the why and the wire). Corral starts it with its listening socket as fd 3 and a pipe as
// stdin: when the pipe closes (Corral stopped or died), it stops accepting, finishes what it
// started and exits; the containers it started run on (their inits are then reparented, as
// `runc run --detach` leaves them).
//
// Usage: corral-runcd serve | corral-runcd version. `corral-runcd init` is runc's init, which
// libcontainer runs in each new container (this binary, sealed, as runc runs itself).
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moby/sys/userns"
	_ "github.com/opencontainers/cgroups/devices" // the device rules of cgroup managers, as in runc
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	_ "github.com/opencontainers/runc/libcontainer/nsenter" // runc init's namespace setup, before Go starts
	"github.com/opencontainers/runc/libcontainer/specconv"
	"github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/selinux/go-selinux"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/runcd"
)

func init() {
	if len(os.Args) > 1 && os.Args[1] == "init" {
		// runc init: libcontainer/nsenter already ran its C part; this never returns.
		libcontainer.Init()
	}
	// The main goroutine keeps the main thread. libcontainer runs a goroutine per start that
	// locks its thread, joins the new container's mount namespace and exits locked, which ends
	// the thread; but the Go runtime never ends the main thread: it would stay, parked, in that
	// container's mount namespace, and keep its mounts (and its disk) alive after a delete.
	runtime.LockOSThread()
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: corral-runcd serve|version")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "version":
		fmt.Println(libcontainerVersion())
	case "serve":
		if err := serve(); err != nil {
			fmt.Fprintln(os.Stderr, "corral-runcd:", err)
			os.Exit(1)
		}
	default:
		fmt.Fprintln(os.Stderr, "usage: corral-runcd serve|version")
		os.Exit(2)
	}
}

// libcontainerVersion is the runc module this binary was built with, e.g. "runc version 1.5.3",
// as `runc --version` says it, so that Corral uses it only beside a runc binary of that version.
func libcontainerVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/opencontainers/runc" {
				v := d.Version
				if d.Replace != nil {
					v = d.Replace.Version
				}
				if len(v) > 1 && v[0] == 'v' {
					v = v[1:]
				}
				return "runc version " + v
			}
		}
	}
	return "runc version unknown"
}

func serve() error {
	logrus.SetLevel(logrus.WarnLevel)
	logrus.SetOutput(os.Stderr)
	f := os.NewFile(3, "listener")
	l, err := net.FileListener(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("fd 3 is not a listening socket: %w", err)
	}
	lis, ok := l.(*net.UnixListener)
	if !ok {
		return fmt.Errorf("fd 3 is a %T, not a unix socket", l)
	}
	null, err := os.OpenFile(os.DevNull, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	// A write to a closed stderr (corrald gone) must not kill this process while it finishes
	// its creates: SIGPIPE handled (not ignored, which the containers' inits would inherit).
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	// Corral holds the write end of stdin: its close is the signal to stop.
	go func() {
		io.Copy(io.Discard, os.Stdin)
		lis.Close()
	}()
	// Accept on an ordinary goroutine; the main one only waits, keeping the main thread.
	done := make(chan error, 1)
	go func() {
		var wg sync.WaitGroup
		defer func() { wg.Wait() }()
		backoff := 5 * time.Millisecond
		for {
			conn, err := lis.AcceptUnix()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					done <- nil
					return
				}
				// Out of descriptors, an aborted connection: the creates in flight go on.
				fmt.Fprintln(os.Stderr, "corral-runcd: accept:", err)
				time.Sleep(backoff)
				backoff = min(2*backoff, time.Second)
				continue
			}
			backoff = 5 * time.Millisecond
			wg.Go(func() {
				defer conn.Close()
				handle(conn, null)
			})
		}
	}()
	return <-done
}

// requestWait bounds the wait for a connection's request.
const requestWait = 10 * time.Second

func handle(conn *net.UnixConn, null *os.File) {
	if err := checkPeer(conn); err != nil {
		runcd.WriteReply(conn, runcd.Reply{Error: "corral-runcd: " + err.Error()})
		return
	}
	conn.SetReadDeadline(time.Now().Add(requestWait))
	req, stdio, extra, err := runcd.ReadRequest(conn)
	if err != nil {
		runcd.WriteReply(conn, runcd.Reply{Error: "corral-runcd: " + err.Error()})
		return
	}
	defer func() {
		stdio.Close()
		for _, f := range extra {
			f.Close()
		}
	}()
	c, pid, err := run(req, stdio, extra, null)
	if err != nil {
		runcd.WriteReply(conn, runcd.Reply{Error: capError(err.Error())})
		return
	}
	if err := runcd.WriteReply(conn, runcd.Reply{Pid: pid}); err != nil {
		// Nobody will record this container (the create gave up): it must not run on.
		fmt.Fprintf(os.Stderr, "corral-runcd: %s started but its create is gone (%v): destroying it\n", req.ID, err)
		c.Signal(unix.SIGKILL)
		if err := c.Destroy(); err != nil {
			fmt.Fprintf(os.Stderr, "corral-runcd: destroy %s: %v\n", req.ID, err)
		}
	}
}

// checkPeer refuses a peer that is not root (the socket is in runc's root directory, 0700;
// this is defence in depth).
func checkPeer(conn *net.UnixConn) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return cerr
	}
	if cred.Uid != 0 {
		return fmt.Errorf("peer uid %d is not root", cred.Uid)
	}
	return nil
}

// capError keeps an error within what a reply carries.
func capError(msg string) string {
	const most = 8 << 10
	if len(msg) > most {
		return msg[:most] + "... (cut)"
	}
	return msg
}

// run is `runc --root req.Root run --detach --bundle req.Bundle req.ID` as runc 1.5's
// startContainer does it, without the chdir into the bundle (this process serves many creates
// at once): the root and relative bind sources are made absolute against the bundle instead,
// and the bundle label set to it.
func run(req runcd.Request, stdio *os.File, extra []*os.File, null *os.File) (*libcontainer.Container, int, error) {
	for _, p := range []struct{ name, path string }{{"root", req.Root}, {"bundle", req.Bundle}} {
		if !filepath.IsAbs(p.path) || filepath.Clean(p.path) != p.path {
			return nil, 0, fmt.Errorf("corral-runcd: %s must be a clean absolute path, got %q", p.name, p.path)
		}
	}
	b, err := os.ReadFile(filepath.Join(req.Bundle, "config.json"))
	if err != nil {
		return nil, 0, err
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, 0, fmt.Errorf("%s/config.json: %w", req.Bundle, err)
	}
	if spec.Process == nil || spec.Root == nil || spec.Linux == nil {
		return nil, 0, fmt.Errorf("%s/config.json: process, root and linux are required", req.Bundle)
	}
	// runc's validateProcessSpec.
	if !filepath.IsAbs(spec.Process.Cwd) || len(spec.Process.Args) == 0 {
		return nil, 0, fmt.Errorf("%s/config.json: process needs an absolute cwd and args", req.Bundle)
	}
	if spec.Process.SelinuxLabel != "" && !selinux.GetEnabled() {
		return nil, 0, errors.New("selinux label is specified in config, but selinux is disabled or not supported")
	}
	if spec.Process.Terminal {
		return nil, 0, errors.New("corral-runcd: a terminal needs a console socket, which it does not take")
	}
	if spec.Linux.Seccomp != nil {
		// Built without libseccomp (cgo against its headers), as Corral's own profile is
		// compiled by Corral and installed by its agent; a profile left to runc goes to runc.
		return nil, 0, errors.New("corral-runcd: seccomp profiles are runc's to compile: use the runc binary for this spec")
	}
	if !filepath.IsAbs(spec.Root.Path) {
		spec.Root.Path = filepath.Join(req.Bundle, spec.Root.Path)
	}
	for i, m := range spec.Mounts {
		if m.Source != "" && !filepath.IsAbs(m.Source) && isBind(m) {
			spec.Mounts[i].Source = filepath.Join(req.Bundle, m.Source)
		}
	}
	cfg, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{
		CgroupName:   req.ID,
		Spec:         &spec,
		RootlessEUID: os.Geteuid() != 0,
		// runc's shouldUseRootlessCgroupManager without --rootless or systemd cgroups: root in a
		// user namespace (a Corral in a rootless container) cannot manage cgroups as root.
		RootlessCgroups: os.Geteuid() != 0 || userns.RunningInUserNS(),
	})
	if err != nil {
		return nil, 0, err
	}
	// The bundle label, which specconv takes from the working directory (runc's is the bundle),
	// is where the runc binary's exec finds the container's config.json.
	for i, l := range cfg.Labels {
		if strings.HasPrefix(l, "bundle=") {
			cfg.Labels[i] = "bundle=" + req.Bundle
		}
	}
	p, err := newProcess(spec.Process)
	if err != nil {
		return nil, 0, err
	}
	p.Init = true
	p.Stdin, p.Stdout, p.Stderr = null, stdio, stdio
	p.ExtraFiles = extra
	p.LogLevel = strconv.Itoa(int(logrus.WarnLevel))
	c, err := libcontainer.Create(req.Root, req.ID, cfg)
	if err != nil {
		return nil, 0, err
	}
	err = c.Run(p)
	// The init is this process's child (runc init's CLONE_PARENT), where `runc run --detach`
	// leaves it to be reparented: reap it when it exits, started or not.
	pid, perr := p.Pid()
	if perr == nil && pid > 0 {
		reapInit(pid)
	}
	if err != nil {
		if derr := c.Destroy(); derr != nil {
			logrus.Warnf("destroy %s after a failed start: %v", req.ID, derr)
		}
		return nil, 0, err
	}
	if perr != nil {
		c.Signal(unix.SIGKILL)
		c.Destroy()
		return nil, 0, perr
	}
	return c, pid, nil
}

// reapInit reaps pid, a container's init (this process's child), once it has exited, which
// may be already. It watches a pidfd in Go's poller: a parked goroutine per live container, no
// thread, and no work for the others when one exits (a sweep of every known pid on each
// SIGCHLD costs each create a wait4 per live container). Only those pids: libcontainer waits
// for the other children it makes.
func reapInit(pid int) {
	exited := func() bool {
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		return got == pid || err != nil // reaped, or not (any more) a child to wait for
	}
	wait := func() { // a thread while it waits: only where no pidfd can be polled
		var ws unix.WaitStatus
		unix.Wait4(pid, &ws, 0, nil)
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		go wait()
		return
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	go func() {
		defer f.Close()
		rc, err := f.SyscallConn()
		if err != nil || rc.Read(func(uintptr) bool { return exited() }) != nil {
			wait()
		}
	}()
}

func isBind(m specs.Mount) bool {
	if m.Type == "bind" {
		return true
	}
	for _, o := range m.Options {
		if o == "bind" || o == "rbind" {
			return true
		}
	}
	return false
}

// newProcess is runc 1.5's newProcess: the spec's process as libcontainer takes it.
func newProcess(sp *specs.Process) (*libcontainer.Process, error) {
	p := &libcontainer.Process{
		Args:            sp.Args,
		Env:             sp.Env,
		UID:             int(sp.User.UID),
		GID:             int(sp.User.GID),
		Cwd:             sp.Cwd,
		Label:           sp.SelinuxLabel,
		NoNewPrivileges: &sp.NoNewPrivileges,
		AppArmorProfile: sp.ApparmorProfile,
		Scheduler:       sp.Scheduler,
		IOPriority:      sp.IOPriority,
	}
	if c := sp.Capabilities; c != nil {
		p.Capabilities = &configs.Capabilities{Bounding: c.Bounding, Effective: c.Effective,
			Inheritable: c.Inheritable, Permitted: c.Permitted, Ambient: c.Ambient}
	}
	for _, g := range sp.User.AdditionalGids {
		p.AdditionalGroups = append(p.AdditionalGroups, int(g))
	}
	for _, rl := range sp.Rlimits {
		t, ok := rlimits[rl.Type]
		if !ok {
			return nil, fmt.Errorf("wrong rlimit value: %s", rl.Type)
		}
		p.Rlimits = append(p.Rlimits, configs.Rlimit{Type: t, Hard: rl.Hard, Soft: rl.Soft})
	}
	aff, err := configs.ConvertCPUAffinity(sp.ExecCPUAffinity)
	if err != nil {
		return nil, err
	}
	p.CPUAffinity = aff
	return p, nil
}

var rlimits = map[string]int{
	"RLIMIT_CPU": unix.RLIMIT_CPU, "RLIMIT_FSIZE": unix.RLIMIT_FSIZE, "RLIMIT_DATA": unix.RLIMIT_DATA,
	"RLIMIT_STACK": unix.RLIMIT_STACK, "RLIMIT_CORE": unix.RLIMIT_CORE, "RLIMIT_RSS": unix.RLIMIT_RSS,
	"RLIMIT_NPROC": unix.RLIMIT_NPROC, "RLIMIT_NOFILE": unix.RLIMIT_NOFILE, "RLIMIT_MEMLOCK": unix.RLIMIT_MEMLOCK,
	"RLIMIT_AS": unix.RLIMIT_AS, "RLIMIT_LOCKS": unix.RLIMIT_LOCKS, "RLIMIT_SIGPENDING": unix.RLIMIT_SIGPENDING,
	"RLIMIT_MSGQUEUE": unix.RLIMIT_MSGQUEUE, "RLIMIT_NICE": unix.RLIMIT_NICE, "RLIMIT_RTPRIO": unix.RLIMIT_RTPRIO,
	"RLIMIT_RTTIME": unix.RLIMIT_RTTIME,
}
