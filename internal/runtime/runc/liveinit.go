package runc

import (
	"errors"
	"sync"

	"golang.org/x/sys/unix"
)

// liveInits holds a pidfd of each sandbox's init that Status found running, so that the next
// Status of a running sandbox polls it (one system call) instead of reading its pid file and
// its cgroup's process list: the edge's reaper asks for every sandbox every second, and those
// two reads were a third of the cost. A pidfd names one process for its life, so a recycled pid
// never passes for a sandbox's init.
type liveInits struct {
	mu sync.Mutex
	m  map[string]liveInit // by sandbox ID; protected by mu
}

type liveInit struct{ fd, pid int }

// alive returns the init's pid when id's pidfd is held and its process has not exited. An
// exited one is dropped.
func (l *liveInits) alive(id string) (pid int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	li, found := l.m[id]
	if !found {
		return 0, false
	}
	if !exited(li.fd) {
		return li.pid, true
	}
	unix.Close(li.fd)
	delete(l.m, id)
	return 0, false
}

// exited reports whether the process behind pidfd has exited (a pidfd polls readable then).
func exited(pidfd int) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err != nil || n > 0
	}
}

// openPidfd returns a pidfd of pid for note, or -1 when it cannot be opened (the process is
// gone, or pidfds are not supported: Status then reads the files every time).
func openPidfd(pid int) int {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1
	}
	unix.CloseOnExec(fd)
	return fd
}

// note keeps fd (from openPidfd, taken before the caller saw pid running in id's cgroup, so it
// names the init) as id's, unless its process has exited meanwhile; fd -1 is ignored.
func (l *liveInits) note(id string, pid, fd int) {
	if fd < 0 {
		return
	}
	if exited(fd) {
		unix.Close(fd)
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]liveInit{}
	}
	if old, ok := l.m[id]; ok {
		unix.Close(old.fd)
	}
	l.m[id] = liveInit{fd: fd, pid: pid}
}

// drop closes id's pidfd, if held.
func (l *liveInits) drop(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if li, ok := l.m[id]; ok {
		unix.Close(li.fd)
		delete(l.m, id)
	}
}

// close closes every pidfd held.
func (l *liveInits) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, li := range l.m {
		unix.Close(li.fd)
		delete(l.m, id)
	}
}
