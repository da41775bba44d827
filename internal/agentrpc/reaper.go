package agentrpc

import (
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// reaper is the process's only caller of wait4. As PID 1 (or a child subreaper) the agent
// inherits every orphan of the sandbox and must reap them all with wait4(-1); a second waiter
// (os/exec's Wait, os.Process.Wait) would race it for the same statuses. So commands are started
// with syscall.ForkExec and their statuses are dispatched by pid from here.
//
// wait4(-1) is process-wide, so there is one reaper per process, shared by every Server in it;
// it runs while at least one Server is serving. A process that runs a Server must not start
// children any other way.
//
// Lock order: forkMu before mu.
type reaper struct {
	// forkMu is read-held by starters across fork and registration and write-held by a sweep, so a
	// child cannot be reaped before its waiter is registered, and ForkExec's own Wait4 of a child
	// that failed to exec is never raced.
	forkMu sync.RWMutex

	mu sync.Mutex
	// Protected by mu:
	users   int
	waiters map[int]*procWaiter
	stop    chan struct{}
	done    chan struct{}
}

var procReaper reaper

// acquire starts the reaper's goroutine when the first user arrives.
func (r *reaper) acquire() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.users++
	if r.users > 1 {
		return
	}
	if r.waiters == nil {
		r.waiters = make(map[int]*procWaiter)
	}
	r.stop, r.done = make(chan struct{}), make(chan struct{})
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGCHLD)
	go r.run(sig, r.stop, r.done)
}

// release stops the reaper's goroutine when the last user leaves, and waits for it.
func (r *reaper) release() {
	r.mu.Lock()
	r.users--
	if r.users > 0 {
		r.mu.Unlock()
		return
	}
	stop, done := r.stop, r.done
	r.mu.Unlock()
	close(stop)
	<-done
}

// run sweeps once at start (children may have exited before SIGCHLD was hooked) and after every
// SIGCHLD until stop is closed.
func (r *reaper) run(sig chan os.Signal, stop, done chan struct{}) {
	defer close(done)
	defer signal.Stop(sig)
	for {
		r.sweep()
		select {
		case <-sig:
		case <-stop:
			return
		}
	}
}

// sweep reaps every child that has exited and hands each status to the waiter registered for its
// pid; statuses of orphans nobody waits for are dropped.
func (r *reaper) sweep() {
	r.forkMu.Lock()
	defer r.forkMu.Unlock()
	for {
		var st procStatus
		pid, err := syscall.Wait4(-1, &st.ws, syscall.WNOHANG|unix.WALL, &st.ru)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return // 0: children left but none exited; ECHILD: no children
		}
		r.mu.Lock()
		w := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if w != nil {
			w.reaped.Store(true)
			w.ch <- st // buffered, one status per pid
		}
	}
}

// procWaiter receives the wait status of one process. A call's command has one the reaper does
// not know: its helper's report fills it (watchCall, calls.go).
type procWaiter struct {
	ch     chan procStatus // capacity 1
	reaped atomic.Bool     // set (under forkMu write-held) when the status is sent
}

func newProcWaiter() *procWaiter { return &procWaiter{ch: make(chan procStatus, 1)} }

// procStatus is how a process ended and what it used (its own and its waited-for descendants').
type procStatus struct {
	ws syscall.WaitStatus
	ru syscall.Rusage
}

// cpuTime is user plus system time.
func (st *procStatus) cpuTime() time.Duration {
	return time.Duration(st.ru.Utime.Nano() + st.ru.Stime.Nano())
}

// maxRSS is ru_maxrss in bytes (the kernel counts KiB).
func (st *procStatus) maxRSS() int64 { return st.ru.Maxrss * 1024 }

// start runs fork (which starts a process and returns its pid) and registers w to receive the
// process's wait status.
func (r *reaper) start(fork func() (int, error), w *procWaiter) (int, error) {
	r.forkMu.RLock()
	defer r.forkMu.RUnlock()
	pid, err := fork()
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	r.waiters[pid] = w
	r.mu.Unlock()
	return pid, nil
}

// signalGroup sends sig to the process group pid led by w's process and reports whether it did.
// It does not once the leader has been reaped: its pid, and so the group id, may then be reused.
// before, when not nil, runs just before the signal is sent, while no sweep can run: what it
// records is visible to whoever receives the status.
func (r *reaper) signalGroup(w *procWaiter, pid int, sig syscall.Signal, before func()) bool {
	r.forkMu.RLock()
	defer r.forkMu.RUnlock()
	if w.reaped.Load() {
		return false
	}
	if before != nil {
		before()
	}
	return syscall.Kill(-pid, sig) == nil
}
