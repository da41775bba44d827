package runc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRuncdLifecycle: corral-runcd starts with the runtime, its sandboxes' inits are its
// children and reaped by it, it is started again after it died (its sandboxes run on), and
// Close ends it.
func TestRuncdLifecycle(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.Runcd = fx.runcd }) // whatever CORRAL_TEST_RUNCD says
	if e.r.engine == nil {
		t.Fatal("no engine with a corral-runcd of runc's version")
	}
	ctx := context.Background()
	sb1 := e.create(e.spec("runcd-1"))
	pid := e.enginePid(t)
	if got := ppid(t, sb1.Pid); got != pid {
		t.Errorf("the init's parent is %d, want corral-runcd (%d)", got, pid)
	}
	okSh(t, sb1.AgentSocket, "true")
	// The runc binary works on what corral-runcd made (runc exec finds the bundle's config).
	if out, err := e.r.runcOutput(ctx, "exec", sb1.ID, "/bin/true"); err != nil {
		t.Errorf("runc exec in a sandbox corral-runcd started: %v %s", err, out)
	}

	// Concurrent creates leave none of corral-runcd's threads in a container's mount namespace
	// (libcontainer joins one on a locked thread per start; on the main thread it would stay).
	n := 6
	if e.cfg.UserNS != nil {
		n = 2 // CORRAL_TEST_USERNS gives each test 4 id ranges
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { e.create(e.spec(fmt.Sprintf("runcd-c%d", i))) })
	}
	wg.Wait()
	hostNS, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/ns/mnt", pid))
	for _, task := range tasks {
		if ns, err := os.Readlink(task); err == nil && ns != hostNS {
			t.Errorf("corral-runcd's thread %s is in mount namespace %s, not the host's %s", task, ns, hostNS)
		}
	}
	for i := range n {
		if err := e.r.Delete(ctx, fmt.Sprintf("runcd-c%d", i)); err != nil {
			t.Fatal(err)
		}
	}

	// An init that dies is reaped by corral-runcd, not left a zombie.
	sb2 := e.create(e.spec("runcd-2"))
	if err := unix.Kill(sb2.Pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", sb2.Pid))
		return errors.Is(err, os.ErrNotExist)
	})
	if err := e.r.Delete(ctx, "runcd-2"); err != nil {
		t.Fatal(err)
	}

	// corral-runcd killed: its sandbox runs on; the next create starts it again.
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return unix.Kill(pid, 0) != nil })
	okSh(t, sb1.AgentSocket, "true")
	sb3 := e.create(e.spec("runcd-3"))
	if pid2 := e.enginePid(t); pid2 == pid {
		t.Errorf("corral-runcd not started again: pid %d", pid2)
	}
	okSh(t, sb3.AgentSocket, "true")
	for _, id := range []string{"runcd-1", "runcd-3"} {
		if err := e.r.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	last := e.enginePid(t)
	if err := e.r.Close(); err != nil {
		t.Fatal(err)
	}
	if unix.Kill(last, 0) == nil {
		t.Errorf("corral-runcd (%d) still runs after Close", last)
	}
	if _, err := os.Stat(e.r.engine.sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("its socket is left: %v", err)
	}
}

// TestRuncdOtherVersion: a corral-runcd whose libcontainer is not the runc binary's is not used
// (their state files must agree); sandboxes start with runc run --detach.
func TestRuncdOtherVersion(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "corral-runcd")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho runc version 0.9.9\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	e := newTestEnv(t, func(c *Config) { c.Runcd = fake })
	if e.r.engine != nil {
		t.Fatal("a corral-runcd of another version was taken")
	}
	sb := e.create(e.spec("runcd-other"))
	okSh(t, sb.AgentSocket, "true")
	if err := e.r.Delete(context.Background(), "runcd-other"); err != nil {
		t.Fatal(err)
	}
}

func (e *testEnv) enginePid(t *testing.T) int {
	t.Helper()
	e.r.engine.mu.Lock()
	defer e.r.engine.mu.Unlock()
	if e.r.engine.cur == nil {
		t.Fatal("corral-runcd is not running")
	}
	return e.r.engine.cur.cmd.Process.Pid
}

func ppid(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "PPid:"); ok {
			var n int
			fmt.Sscan(strings.TrimSpace(v), &n)
			return n
		}
	}
	t.Fatalf("no PPid in /proc/%d/status", pid)
	return 0
}

// TestRuncdPinnedToRunc: corral-runcd's libcontainer (go.mod), the runc that
// scripts/install-runc.sh builds and DefaultRunc are one version, or corral-runcd goes unused.
func TestRuncdPinnedToRunc(t *testing.T) {
	gomod, err := os.ReadFile("../../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var lib string
	for _, l := range strings.Split(string(gomod), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "github.com/opencontainers/runc" {
			lib = f[1]
		}
	}
	script, err := os.ReadFile("../../../scripts/install-runc.sh")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(script), `version="${RUNC_VERSION:-`)
	built, _, _ := strings.Cut(rest, `}"`)
	if lib == "" || !ok || built == "" {
		t.Fatalf("go.mod's runc %q, install-runc.sh's %q: one not found", lib, built)
	}
	if lib != built || !strings.Contains(DefaultRunc, "/"+built+"/") {
		t.Errorf("go.mod requires runc %s, install-runc.sh builds %s, DefaultRunc is %s: keep them one version", lib, built, DefaultRunc)
	}
}

// TestRuncdUnavailable: a create whose corral-runcd cannot be started goes to the runc binary.
func TestRuncdUnavailable(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.Runcd = fx.runcd }) // whatever CORRAL_TEST_RUNCD says
	if e.r.engine == nil {
		t.Fatal("no engine with a corral-runcd of runc's version")
	}
	// The one New started stops, and its binary is gone (as if removed after the start).
	p := e.enginePid(t)
	e.r.engine.stopped(e.r.engine.cur)
	waitFor(t, 10*time.Second, func() bool { return unix.Kill(p, 0) != nil })
	e.r.engine.bin = filepath.Join(t.TempDir(), "gone")
	sb := e.create(e.spec("runcd-gone"))
	okSh(t, sb.AgentSocket, "true")
	if err := e.r.Delete(context.Background(), "runcd-gone"); err != nil {
		t.Fatal(err)
	}
}

// open says whether close has not been called.
func (e *engine) open() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return !e.closed
}
