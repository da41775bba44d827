package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestRedTeamFloods: a sandbox floods its output with `yes` and forks without end. Its output is
// capped and the loss recorded, its pids limit holds, and meanwhile the API and a neighbour
// sandbox keep answering (the bound on /healthz latency is generous: it catches a stalled server,
// not a slow machine). Afterwards the sandbox is usable again, or (gVisor, whose own threads
// share the host's pids limit) has failed cleanly, alone.
func TestRedTeamFloods(t *testing.T) { forRuntimes(t, testRedTeamFloods) }

func testRedTeamFloods(t *testing.T, rt string) {
	p := withBaseOn(t, rt)
	ctx := context.Background()
	const outputCap = 64 << 10
	sb := p.create(corral.CreateRequest{Limits: corral.Limits{OutputBytes: outputCap, Pids: 64}})
	neighbour := p.create(corral.CreateRequest{})

	// watch measures /healthz and an exec in the neighbour until stop is closed, and returns the
	// slowest of each.
	watch := func(stop chan struct{}) func() (time.Duration, time.Duration, error) {
		var mu sync.Mutex
		var health, exec time.Duration
		var firstErr error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				start := time.Now()
				resp, err := http.Get(p.URL + "/healthz")
				d := time.Since(start)
				mu.Lock()
				health = max(health, d)
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode != 200 {
						firstErr = err
					}
				} else if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		}()
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(500 * time.Millisecond):
				}
				start := time.Now()
				out, _, exit, err := p.Client.Run(ctx, neighbour.ID, corral.ExecRequest{Argv: []string{"echo", "ok"}})
				d := time.Since(start)
				mu.Lock()
				exec = max(exec, d)
				if (err != nil || exit.Code != 0 || string(out) != "ok\n") && firstErr == nil {
					firstErr = err
					if firstErr == nil {
						firstErr = errExit(exit, out)
					}
				}
				mu.Unlock()
			}
		}()
		return func() (time.Duration, time.Duration, error) {
			wg.Wait()
			return health, exec, firstErr
		}
	}
	// Generous bounds: a stalled API or a neighbour starved for good, not a busy machine.
	healthBound, execBound := 5*time.Second, 30*time.Second

	t.Run("yes flood", func(t *testing.T) {
		stop := make(chan struct{})
		done := watch(stop)
		var cmds []*corral.Command
		for range 2 {
			c, err := p.Client.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"yes", "flood"}, Timeout: "8s"})
			if err != nil {
				t.Fatal(err)
			}
			cmds = append(cmds, c)
		}
		for _, c := range cmds {
			eventually(t, 60*time.Second, "the flood to time out", func() bool {
				got, err := p.Client.Command(ctx, sb.ID, c.ID)
				return err == nil && got.State == "exited"
			})
		}
		close(stop)
		health, exec, err := done()
		t.Logf("during the flood: slowest /healthz %s, slowest neighbour exec %s", health, exec)
		if err != nil {
			t.Errorf("the API or the neighbour failed during the flood: %v", err)
		}
		if health > healthBound || exec > execBound {
			t.Errorf("during the flood: /healthz took up to %s (bound %s), a neighbour's exec %s (bound %s)", health, healthBound, exec, execBound)
		}
		for _, c := range cmds {
			got, _ := p.Client.Command(ctx, sb.ID, c.ID)
			if got.Exit == nil || !got.Exit.TimedOut {
				t.Errorf("flood command: exit %+v, want timed out", got.Exit)
			}
			if kept := got.OutputEnd - got.OutputStart; kept > outputCap || got.OutputEnd <= outputCap {
				t.Errorf("flood output: kept [%d, %d), want at most %d kept of more", got.OutputStart, got.OutputEnd, outputCap)
			}
			st, err := p.Client.Attach(ctx, sb.ID, c.ID, 0, false)
			if err != nil {
				t.Fatal(err)
			}
			ev, err := st.Next()
			st.Close()
			if err != nil || ev.Type != "truncated" || ev.Dropped == 0 {
				t.Errorf("attach from 0: first event %+v, %v; want the truncation recorded", ev, err)
			}
		}
	})

	t.Run("fork bomb", func(t *testing.T) {
		stop := make(chan struct{})
		done := watch(stop)
		bomb, err := p.Client.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", "b() { b | b & }; b"}, Timeout: "10s"})
		if err != nil {
			t.Fatal(err)
		}
		// The limit holds on the host: the sandbox's cgroup never has more than pids.max.
		if rt != "microvm" {
			var peak, limit int64
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				mx, cur, ok := cgroupPids(p, sb.ID)
				if !ok {
					break // the sandbox ended (gVisor, below)
				}
				limit, peak = mx, max(peak, cur)
				if cur > mx {
					t.Errorf("pids.current %d over pids.max %d", cur, mx)
				}
			}
			t.Logf("pids.max %d, highest pids.current seen %d", limit, peak)
		}
		eventually(t, 90*time.Second, "the bomb to end", func() bool {
			if got, err := p.Client.Command(ctx, sb.ID, bomb.ID); err == nil && got.State == "exited" {
				return true
			}
			got, err := p.Client.GetSandbox(ctx, sb.ID)
			return err == nil && got.State != corral.StateRunning
		})
		close(stop)
		health, exec, err := done()
		t.Logf("during the bomb: slowest /healthz %s, slowest neighbour exec %s", health, exec)
		if err != nil {
			t.Errorf("the API or the neighbour failed during the bomb: %v", err)
		}
		if health > healthBound || exec > execBound {
			t.Errorf("during the bomb: /healthz took up to %s (bound %s), a neighbour's exec %s (bound %s)", health, healthBound, exec, execBound)
		}
		got, err := p.Client.GetSandbox(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == corral.StateFailed {
			// gVisor: the bomb exhausts the host's pids limit, which gVisor's own threads share,
			// and the sandbox ends. microvm: the guest's agent shares the guest's pids cgroup and
			// memory with the bomb, and on a loaded host the guest can lose it (seen once in a
			// full run), which ends the VM. Either fails cleanly, with a reason, and only it.
			if rt == "runc" || got.Reason == "" {
				t.Fatalf("after the bomb: %s (%s)", got.State, got.Reason)
			}
			t.Logf("the bomb ended the %s sandbox: %s", rt, got.Reason)
			eventually(t, 30*time.Second, "the failed sandbox's cgroup removed", func() bool {
				_, _, ok := cgroupPids(p, sb.ID)
				return !ok
			})
			return
		}
		// Recoverable: once the bomb's processes are gone, the sandbox runs commands again.
		eventually(t, 60*time.Second, "the sandbox to run a command after the bomb", func() bool {
			out, _, exit, err := p.Client.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", "kill -9 -1 2>/dev/null; echo ok"}})
			return err == nil && exit.Code == 0 && strings.Contains(string(out), "ok")
		})
		if rt == "runc" {
			// The limit was reached, and the kernel counted the forks it refused.
			if ev := cgroupFile(p, sb.ID, "pids.events"); !strings.Contains(ev, "max ") || strings.Contains(ev, "max 0") {
				t.Errorf("pids.events after the bomb: %q, want refused forks counted", ev)
			}
		}
	})
}

type exitError struct {
	exit *corral.Exit
	out  []byte
}

func (e exitError) Error() string { return "exit " + strconv.Itoa(e.exit.Code) + ": " + string(e.out) }

func errExit(exit *corral.Exit, out []byte) error {
	if exit == nil {
		exit = &corral.Exit{Code: -1}
	}
	return exitError{exit, out}
}

// cgroupFile reads a file of a sandbox's pids cgroup on the host (cgroup v1 or v2); "" if none.
func cgroupFile(p *corralProc, id, name string) string {
	for _, dir := range []string{"/sys/fs/cgroup/pids" + p.Cgroup + "/" + id, "/sys/fs/cgroup" + p.Cgroup + "/" + id} {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	return ""
}

// cgroupPids reads a sandbox's pids.max and pids.current on the host; ok is false when the
// sandbox has no cgroup (any more).
func cgroupPids(p *corralProc, id string) (limit, current int64, ok bool) {
	m, c := cgroupFile(p, id, "pids.max"), cgroupFile(p, id, "pids.current")
	if m == "" || c == "" {
		return 0, 0, false
	}
	limit, _ = strconv.ParseInt(m, 10, 64)
	current, _ = strconv.ParseInt(c, 10, 64)
	return limit, current, true
}
