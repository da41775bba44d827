// Command standin plays corral-agent in this package's tests: it accepts on the listening socket
// it inherits as fd 3, reads one shell command line per connection, runs it with /bin/sh -c and
// answers {"out": combined output, "code": exit status} as one JSON line.
//
// Two built-in commands, run by the agent itself, hold memory for the pause tests: "@hold N"
// maps N MiB of anonymous memory and writes a pseudo-random pattern over it (again, dirtying
// every page, when repeated); "@check" verifies the pattern and answers "ok N MiB".
//
// It does what the real agent must do as a sandbox's init: become non-dumpable, close fd 4 (its
// own binary), keep fd 3 away from children, and reap every child, orphans included.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"github.com/corral-dev/corral/internal/rlimitenv"
	"github.com/corral-dev/corral/internal/seccompbpf"
	"github.com/corral-dev/corral/internal/usernsinit"
)

func main() {
	// The sandbox's rlimits where runc could not set them, as the real agent sets them.
	if err := rlimitenv.ApplyFromEnv(); err != nil {
		fail("rlimits: " + err.Error())
	}
	// The sandbox's compiled seccomp profile, first thing, as the real agent installs it.
	if err := seccompbpf.InstallFromEnv(); err != nil {
		fail("seccomp: " + err.Error())
	}
	// On the host, around a sandbox in a user namespace, as the real agent does.
	if len(os.Args) > 1 && os.Args[1] == usernsinit.HelperCmd {
		os.Exit(usernsinit.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	// Non-dumpable: no process inside may ptrace this one or open /proc/1/{exe,fd/*,mem,environ},
	// which would reach the control socket and this binary. "--dumpable" skips it, for the test
	// that shows why.
	if len(os.Args) < 3 || os.Args[2] != "--dumpable" {
		if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0); e != 0 {
			fail("prctl: " + e.Error())
		}
	}
	syscall.Close(4) // this binary (runc exec'd /proc/self/fd/4)
	f := os.NewFile(3, "agent.sock")
	l, err := net.FileListener(f) // a close-on-exec dup of fd 3
	if err != nil {
		fail(err.Error())
	}
	f.Close()
	// Hook SIGCHLD before the first command can start, or its exit may go unnoticed.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	go reap(sigs)
	for {
		c, err := l.Accept()
		if err != nil {
			fail(err.Error())
		}
		go serve(c)
	}
}

func fail(msg string) {
	os.Stderr.WriteString("standin: " + msg + "\n")
	os.Exit(1)
}

// As pid 1 this process inherits every orphan. One loop reaps all children and hands the
// statuses of the ones it started to their waiters: os/exec's Wait would race with it.
var (
	mu      sync.Mutex
	waiters = map[int]chan syscall.WaitStatus{} // protected by mu
	early   = map[int]syscall.WaitStatus{}      // exited before registered; protected by mu
)

func reap(sigs chan os.Signal) {
	for {
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if err == syscall.EINTR {
				continue
			}
			if pid <= 0 || err != nil {
				break
			}
			mu.Lock()
			if ch, ok := waiters[pid]; ok {
				ch <- ws
				delete(waiters, pid)
			} else {
				early[pid] = ws
			}
			mu.Unlock()
		}
		<-sigs
	}
}

func run(cmdline string) (string, int) {
	r, w, err := os.Pipe()
	if err != nil {
		return err.Error(), -1
	}
	null, _ := os.Open(os.DevNull)
	defer null.Close()
	// The agent runs with oom_score_adj -1000 where the host allows it; children go back to 0.
	argv := []string{"/bin/sh", "-c", "echo 0 >/proc/self/oom_score_adj; " + cmdline}
	ch := make(chan syscall.WaitStatus, 1)
	mu.Lock()
	p, err := os.StartProcess(argv[0], argv, &os.ProcAttr{Files: []*os.File{null, w, w}})
	if err == nil {
		if ws, ok := early[p.Pid]; ok {
			ch <- ws
			delete(early, p.Pid)
		} else {
			waiters[p.Pid] = ch
		}
	}
	mu.Unlock()
	w.Close()
	if err != nil {
		r.Close()
		return err.Error(), -1
	}
	out, _ := io.ReadAll(r)
	r.Close()
	ws := <-ch
	code := ws.ExitStatus()
	if ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	return string(out), code
}

func serve(c net.Conn) {
	defer c.Close()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return
	}
	var out string
	var code int
	if strings.HasPrefix(line, "@") {
		out, code = builtin(strings.Fields(line))
	} else {
		out, code = run(line)
	}
	json.NewEncoder(c).Encode(struct {
		Out  string `json:"out"`
		Code int    `json:"code"`
	}{out, code})
}

// held is the memory of "@hold", outside the Go heap so that the collector never touches it.
var (
	heldMu sync.Mutex
	held   []byte // protected by heldMu
)

func builtin(args []string) (string, int) {
	heldMu.Lock()
	defer heldMu.Unlock()
	switch {
	case len(args) == 2 && args[0] == "@hold":
		mib, err := strconv.Atoi(args[1])
		if err != nil || mib <= 0 || (held != nil && len(held) != mib<<20) {
			return "usage: @hold MiB (the same MiB every time)", 2
		}
		if held == nil {
			b, err := syscall.Mmap(-1, 0, mib<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
			if err != nil {
				return err.Error(), 1
			}
			held = b
		}
		pattern(words(held), true)
		return fmt.Sprintf("held %d MiB", mib), 0
	case len(args) == 1 && args[0] == "@check":
		if bad := pattern(words(held), false); bad >= 0 {
			return fmt.Sprintf("mismatch at byte %d", bad*8), 1
		}
		return fmt.Sprintf("ok %d MiB", len(held)>>20), 0
	}
	return "unknown built-in", 2
}

func words(b []byte) []uint64 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), len(b)/8)
}

// pattern writes a pseudo-random sequence (xorshift64) over u, or compares u with it and returns
// the index of the first word that differs; -1 when none does (or when it wrote).
func pattern(u []uint64, write bool) int {
	x := uint64(0x9E3779B97F4A7C15)
	for i := range u {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		if write {
			u[i] = x
		} else if u[i] != x {
			return i
		}
	}
	return -1
}
