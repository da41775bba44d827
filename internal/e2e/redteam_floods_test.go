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
// not a slow machine). Afterwards the sandbox is usable again.
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
			pidsMax, current := cgroupPids(t, p, sb.ID)
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				if _, cur := cgroupPids(t, p, sb.ID); cur > pidsMax {
					t.Errorf("pids.current %d over pids.max %d", cur, pidsMax)
				}
				time.Sleep(100 * time.Millisecond)
			}
			t.Logf("pids.max %d, pids.current at start %d", pidsMax, current)
		}
		eventually(t, 90*time.Second, "the bomb to end", func() bool {
			got, err := p.Client.Command(ctx, sb.ID, bomb.ID)
			return err == nil && got.State == "exited"
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
		// Recoverable: once the bomb's processes are gone, the sandbox runs commands again.
		eventually(t, 60*time.Second, "the sandbox to run a command after the bomb", func() bool {
			out, _, exit, err := p.Client.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", "kill -9 -1 2>/dev/null; echo ok"}})
			return err == nil && exit.Code == 0 && strings.Contains(string(out), "ok")
		})
		got, err := p.Client.GetSandbox(ctx, sb.ID)
		if err != nil || got.State != corral.StateRunning {
			t.Fatalf("after the bomb: %+v, %v", got, err)
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

// cgroupPids reads a sandbox's pids.max and pids.current on the host (cgroup v1 or v2).
func cgroupPids(t *testing.T, p *corralProc, id string) (int64, int64) {
	t.Helper()
	for _, dir := range []string{"/sys/fs/cgroup/pids" + p.Cgroup + "/" + id, "/sys/fs/cgroup" + p.Cgroup + "/" + id} {
		m, err := os.ReadFile(filepath.Join(dir, "pids.max"))
		if err != nil {
			continue
		}
		c, _ := os.ReadFile(filepath.Join(dir, "pids.current"))
		mx, _ := strconv.ParseInt(strings.TrimSpace(string(m)), 10, 64)
		cur, _ := strconv.ParseInt(strings.TrimSpace(string(c)), 10, 64)
		return mx, cur
	}
	t.Fatalf("no pids cgroup for %s under %s", id, p.Cgroup)
	return 0, 0
}
