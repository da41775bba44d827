package agentrpc

import (
	"context"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestHardenTrapsSignalsAndDisablesDumping sends this process the signals that would end or stop
// an unprotected Go program; the test binary surviving them is the check. (cmd/corral-agent's
// tests repeat this against the real binary, and check /proc access from the same uid.)
func TestHardenTrapsSignalsAndDisablesDumping(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer func() {
		cancel()
		unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0)
	}()
	if err := Harden(ctx); err != nil {
		t.Fatal(err)
	}
	if d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); err != nil || d != 0 {
		t.Errorf("PR_GET_DUMPABLE = %d, %v; want 0", d, err)
	}
	sync := make(chan os.Signal, 1)
	signal.Notify(sync, syscall.SIGWINCH)
	defer signal.Stop(sync)
	// Every signal but the two no process can catch: those Harden traps, and those the Go
	// runtime drops by itself.
	for i := 1; i <= 64; i++ {
		sig := syscall.Signal(i)
		if sig == syscall.SIGKILL || sig == syscall.SIGSTOP || sig == syscall.SIGWINCH {
			continue
		}
		if err := syscall.Kill(os.Getpid(), sig); err != nil {
			t.Fatalf("kill %v: %v", sig, err)
		}
	}
	syscall.Kill(os.Getpid(), syscall.SIGWINCH)
	select {
	case <-sync:
	case <-time.After(5 * time.Second):
		t.Fatal("SIGWINCH not delivered")
	}
}

func TestTrappedSignals(t *testing.T) {
	seen := map[os.Signal]bool{}
	for _, s := range trappedSignals() {
		switch s {
		case syscall.SIGKILL, syscall.SIGSTOP, syscall.SIGCHLD, syscall.SIGURG, syscall.Signal(32), syscall.Signal(34):
			t.Errorf("%v must not be trapped", s)
		}
		if seen[s] {
			t.Errorf("%v listed twice", s)
		}
		seen[s] = true
	}
}

// TestListenFD passes a listening socket by descriptor number, as the edge does with fd 3.
func TestListenFD(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	f, err := ln.(*net.UnixListener).File()
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	// A descriptor no *os.File owns (a File's finalizer would close the number again later, by
	// then perhaps someone else's), and, as inherited, not close-on-exec.
	fd, err := unix.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	l, err := ListenFD(fd)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != unix.EBADF {
		t.Errorf("inherited fd %d still open after ListenFD (%v)", fd, err)
	}
	lf, _ := l.(*net.UnixListener).SyscallConn()
	lf.Control(func(dup uintptr) {
		if flags, _ := unix.FcntlInt(dup, unix.F_GETFD, 0); flags&unix.FD_CLOEXEC == 0 {
			t.Errorf("listener fd %d is not close-on-exec", dup)
		}
	})
	srv, err := NewServer(Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	if _, err := NewClient(sock).Ping(testCtx(t)); err != nil {
		t.Errorf("Ping through the inherited socket: %v", err)
	}
	cancel()
	<-done
	if _, err := ListenFD(fd); err == nil {
		t.Error("ListenFD of a closed descriptor succeeded")
	}
}
