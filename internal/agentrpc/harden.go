package agentrpc

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Harden protects the calling process, the agent, from the sandbox it serves, until ctx ends:
//
//   - every descriptor it inherited (beyond stdin, stdout and stderr) becomes close-on-exec, so
//     none leaks into a command;
//   - it becomes non-dumpable, so sandbox processes (root included, lacking CAP_SYS_PTRACE over
//     the agent) can neither ptrace it nor open its /proc/<pid>/{mem,environ,fd/*};
//   - every catchable signal is dropped, so a kill from inside the sandbox neither ends, crashes
//     nor stops it: those whose action would are trapped (trappedSignals), the Go runtime drops
//     the others itself. SIGCHLD is left to the reaper, and SIGURG to the Go runtime, which uses
//     it for preemption. SIGKILL and SIGSTOP cannot be caught, and signals 32 and 34 (reserved for
//     libc, so the Go runtime neither handles them nor lets os/signal do so) keep their default
//     action: the kernel does not deliver any of these to a PID namespace's init from inside the
//     namespace. When the agent is not PID 1, 32 and 34 are set to SIG_IGN instead, which its
//     commands then inherit.
//
// Handlers, unlike ignored dispositions, are reset by execve, so commands start with default
// signal handling.
func Harden(ctx context.Context) error {
	if err := closeOnExecInherited(); err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("set non-dumpable: %w", err)
	}
	ignored := os.Getpid() != 1
	if ignored {
		for _, sig := range unhandledSignals {
			if err := setIgnored(sig, true); err != nil {
				return fmt.Errorf("ignore signal %d: %w", sig, err)
			}
		}
	}
	ch := make(chan os.Signal, 32)
	signal.Notify(ch, trappedSignals()...)
	go func() {
		defer signal.Stop(ch)
		if ignored {
			defer func() {
				for _, sig := range unhandledSignals {
					setIgnored(sig, false)
				}
			}()
		}
		for {
			select {
			case <-ch:
			case <-ctx.Done():
				return
			}
		}
	}()
	return nil
}

// closeOnExecInherited marks every descriptor from 3 up close-on-exec. Descriptors the Go runtime
// and this package open already are; this catches those inherited from the parent.
func closeOnExecInherited() error {
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err == nil {
		return nil
	}
	// Before Linux 5.11: one descriptor at a time.
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("list descriptors: %w", err)
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.CloseOnExec(fd)
		}
	}
	return nil
}

// unhandledSignals are the signals the Go runtime installs no handler for (SIGCANCEL and musl's
// SIGSYNCCALL): their default action, termination, cannot be trapped with os/signal.
var unhandledSignals = []syscall.Signal{32, 34}

// kernelSigaction is struct sigaction as rt_sigaction(2) takes it. Only the handler is set; on
// architectures without sa_restorer, the zero restorer reads as the zero mask.
type kernelSigaction struct {
	handler  uintptr
	flags    uint64
	restorer uintptr
	mask     uint64
}

// setIgnored sets sig's disposition to SIG_IGN, or back to SIG_DFL.
func setIgnored(sig syscall.Signal, ignore bool) error {
	var sa kernelSigaction
	if ignore {
		sa.handler = 1 // SIG_IGN
	}
	_, _, errno := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&sa)), 0, 8, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// trappedSignals lists the signals Harden traps: those another process could end, crash or stop
// the agent with. Go's runtime already catches every other signal and takes no action on one
// another process sends (os/signal's documentation; sighandler in the runtime's signal_unix.go):
// it exits on SIGHUP, SIGINT and SIGTERM, crashes on SIGQUIT, SIGILL, SIGTRAP, SIGABRT, SIGSTKFLT
// and SIGSYS, and on SIGBUS, SIGFPE and SIGSEGV when they come from a process (from the kernel
// they are the panics of a bad access or division, trapped or not), and leaves SIGTSTP, SIGTTIN
// and SIGTTOU to the system's default, which stops it. SIGPIPE too: the runtime exits on it when
// a write to stdout or stderr finds a closed pipe. Each trapped signal costs a round trip to
// the runtime's signal thread at start (15-20 µs here): trapping all 58 catchable signals took a
// quarter of the agent's start, on the path of a new sandbox's first command.
func trappedSignals() []os.Signal {
	return []os.Signal{
		syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM,
		syscall.SIGQUIT, syscall.SIGILL, syscall.SIGTRAP, syscall.SIGABRT, syscall.SIGSTKFLT, syscall.SIGSYS,
		syscall.SIGBUS, syscall.SIGFPE, syscall.SIGSEGV,
		syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU,
		syscall.SIGPIPE,
	}
}

// ListenFD returns the listener for the inherited listening unix socket fd. fd is marked
// close-on-exec and then closed: the listener holds its own close-on-exec duplicate, so no
// command ever inherits the socket.
func ListenFD(fd int) (net.Listener, error) {
	unix.CloseOnExec(fd)
	f := os.NewFile(uintptr(fd), "agent-listener")
	defer f.Close()
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("listener fd %d: %w", fd, err)
	}
	if _, ok := ln.(*net.UnixListener); !ok {
		ln.Close()
		return nil, fmt.Errorf("listener fd %d: not a unix socket", fd)
	}
	return ln, nil
}
