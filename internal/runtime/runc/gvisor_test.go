package runc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime"
)

// The real corral-agent, built once: gVisor sandboxes need its --stdio mode and its holder.
var realAgent struct {
	once sync.Once
	path string
	err  error
}

// buildRealAgent builds corral-agent once, as it ships (static, no cgo). Preconditions: needRoot.
func buildRealAgent(t testing.TB) string {
	t.Helper()
	realAgent.once.Do(func() {
		realAgent.path = filepath.Join(fx.dir, "corral-agent")
		cmd := exec.Command("go", "build", "-o", realAgent.path, "github.com/corral-dev/corral/cmd/corral-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			realAgent.err = fmt.Errorf("build corral-agent: %v: %s", err, out)
		}
	})
	if realAgent.err != nil {
		t.Fatal(realAgent.err)
	}
	return realAgent.path
}

func runscPath() string {
	if p := os.Getenv("CORRAL_RUNSC"); p != "" {
		return p
	}
	return DefaultRunsc
}

// newGVisorEnv is newTestEnv for gVisor tests; it skips when runsc is not installed.
func newGVisorEnv(t *testing.T) *testEnv {
	t.Helper()
	needRoot(t)
	if _, err := os.Stat(runscPath()); err != nil {
		t.Skipf("needs runsc at %s (scripts/install-runsc.sh builds it; or set CORRAL_RUNSC)", runscPath())
	}
	buildRealAgent(t)
	e := newTestEnv(t, func(c *Config) {
		c.Runsc = runscPath()
		c.RunscRoot = filepath.Join(filepath.Dir(c.StateDir), "g")
	})
	if _, err := e.r.GVisor(); err != nil {
		t.Fatalf("GVisor: %v", err)
	}
	return e
}

func (e *testEnv) gvisorSpec(id string) Spec {
	s := e.spec(id)
	s.Runtime = string(EngineGVisor)
	s.AgentPath = realAgent.path
	s.AgentArgs = []string{"serve"}
	return s
}

// agentRun runs argv through the agent and returns its stdout; it fails the test on a non-zero exit.
func agentRun(t testing.TB, c *agentrpc.Client, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := c.Exec(ctx, agentrpc.ExecRequest{Argv: argv})
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	defer s.Close()
	var out, errb bytes.Buffer
	var exit *agentrpc.Exit
	for exit == nil {
		ev, err := s.Next()
		if err != nil {
			t.Fatalf("exec %q: %v", argv, err)
		}
		switch {
		case ev.Exit != nil:
			exit = ev.Exit
		case ev.Type == "stdout":
			out.Write(ev.Data)
		case ev.Type == "stderr":
			errb.Write(ev.Data)
		}
	}
	if exit.Code != 0 {
		t.Fatalf("exec %q: exit %d: %s%s", argv, exit.Code, out.String(), errb.String())
	}
	return strings.TrimSpace(out.String())
}

// TestGVisorLifecycle: a gVisor sandbox runs the same agent, sees its layers and writes to its
// disk; checkpoint pause frees its processes, restore brings back files and a running process
// with its memory; delete leaves nothing behind.
func TestGVisorLifecycle(t *testing.T) {
	e := newGVisorEnv(t)
	ctx := context.Background()
	sb := e.create(e.gvisorSpec("gv1"))
	c := agentrpc.NewClient(sb.AgentSocket)

	if got := agentRun(t, c, "cat", "/etc/corral-layer"); got != "top" {
		t.Errorf("layer file = %q, want top", got)
	}
	// gVisor's kernel, not the host's.
	if got := agentRun(t, c, "dmesg"); !strings.Contains(got, "gVisor") {
		t.Errorf("dmesg does not mention gVisor: %.200q", got)
	}
	agentRun(t, c, "sh", "-c", "echo kept > /root/file")
	if _, err := os.Stat(filepath.Join(sb.Dir, diskMount, "upper/root/file")); err != nil {
		t.Errorf("write did not reach the sandbox's disk (overlay2 must be none): %v", err)
	}
	// A process whose state lives only in memory: a counter in a shell loop.
	if _, err := c.Start(ctx, agentrpc.ExecRequest{Argv: []string{"sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.05; done"}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)

	st := pause(t, e, sb.ID)
	if st.MemoryBefore == 0 {
		t.Errorf("MemoryBefore = 0")
	}
	if s, err := e.r.Status(ctx, sb.ID); err != nil || s.State != runtime.StatePaused {
		t.Fatalf("Status after pause = %+v, %v; want paused", s, err)
	}
	if _, err := e.r.Pause(ctx, sb.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second Pause: %v, want conflict", err)
	}
	if _, err := c.Ping(ctx); err == nil {
		t.Errorf("agent answered while checkpointed")
	}
	if err := e.r.Freeze(ctx, sb.ID); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Freeze of a gVisor sandbox: %v, want invalid", err)
	}
	// A restarted Runtime sees it paused.
	e.r.Close()
	e.r = e.open()
	if o, err := e.r.Open(ctx, sb.ID); err != nil || o.Pid != 0 || o.AgentSocket != sb.AgentSocket {
		t.Fatalf("Open of checkpointed sandbox = %+v, %v", o, err)
	}

	resume(t, e, sb.ID)
	if s, err := e.r.Status(ctx, sb.ID); err != nil || s.State != runtime.StateRunning {
		t.Fatalf("Status after resume = %+v, %v; want running", s, err)
	}
	if got := agentRun(t, c, "cat", "/root/file"); got != "kept" {
		t.Errorf("file after restore = %q", got)
	}
	n1 := agentRun(t, c, "cat", "/tmp/n")
	time.Sleep(300 * time.Millisecond)
	n2 := agentRun(t, c, "cat", "/tmp/n")
	if n1 == n2 || n1 == "" {
		t.Errorf("counter did not keep running after restore: %q then %q", n1, n2)
	}
	// A second cycle works too (each restore gets new pipes and a new holder).
	pause(t, e, sb.ID)
	resume(t, e, sb.ID)
	agentRun(t, c, "true")

	if err := e.r.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if out, _ := exec.Command(runscPath(), "--root", e.cfg.RunscRoot, "list", "-q").Output(); len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("runsc containers left: %q", out)
	}
}

// TestGVisorChannelOutOfReach: nothing inside a gVisor sandbox leads to the agent's link (no
// socket file, no unix socket at all, no descriptor to inherit or reopen), the link's holder
// outlives the Runtime that started it, and a new Runtime reaches the agent through it.
func TestGVisorChannelOutOfReach(t *testing.T) {
	e := newGVisorEnv(t)
	ctx := context.Background()
	sb := e.create(e.gvisorSpec("gv2"))
	c := agentrpc.NewClient(sb.AgentSocket)
	for _, tc := range []struct{ name, script, want string }{
		{"no socket file", "find / -xdev -type s 2>/dev/null; find /dev /tmp /run -type s 2>/dev/null; true", ""},
		{"no unix socket in the kernel", "tail -n +2 /proc/net/unix", ""},
		{"no agent directory", "ls -d /.corral 2>/dev/null || echo none", "none"},
		{"agent's stdio not reopenable", "cat /proc/1/fd/0 2>/dev/null; echo x >/proc/1/fd/1 2>/dev/null || echo refused", "refused"},
		{"commands inherit no link", "ls /proc/self/fd | tr '\\n' ' '", "0 1 2 3"},
	} {
		if got := agentRun(t, c, "sh", "-c", tc.script); got != tc.want {
			t.Errorf("%s: %q printed %q, want %q", tc.name, tc.script, got, tc.want)
		}
	}
	if _, err := os.Stat(filepath.Join(sb.Dir, ctlSocketName)); err != nil {
		t.Errorf("holder socket: %v", err)
	}

	// A new Runtime (a restart of corral) reaches the running sandbox through the same holder.
	agentRun(t, c, "sh", "-c", "echo before > /tmp/state")
	e.r.Close()
	if _, err := c.Ping(ctx); err == nil {
		t.Errorf("agent socket answered with no Runtime serving it")
	}
	e.r = e.open()
	o, err := e.r.Open(ctx, sb.ID)
	if err != nil || o.AgentSocket != sb.AgentSocket || o.Pid == 0 {
		t.Fatalf("Open = %+v, %v", o, err)
	}
	if got := agentRun(t, c, "cat", "/tmp/state"); got != "before" {
		t.Errorf("after re-adoption: %q", got)
	}
	if err := e.r.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sb.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sandbox directory left: %v", err)
	}
}
