package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

func hostHasSwap() bool {
	b, _ := os.ReadFile("/proc/swaps")
	return len(strings.Split(strings.TrimSpace(string(b)), "\n")) > 1
}

// TestPauseResume: pause freezes the sandbox and returns its memory, any call resumes it with its
// processes and files intact, state survives kill -9 of corral, and bad transitions are 409s.
func TestPauseResume(t *testing.T) { forRuntimes(t, testPauseResume) }

func testPauseResume(t *testing.T, rt string) {
	p := withBaseOn(t, rt)
	ctx := context.Background()
	sb := p.create(corral.CreateRequest{Limits: corral.Limits{MemoryBytes: 1 << 30}})
	p.sh(sb.ID, "echo kept > /root/file")
	// A process holding ~256 MiB of anonymous memory.
	hold, err := p.Client.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"awk",
		`BEGIN { s = "x"; while (length(s) < 200000000) s = s s; print "ready"; fflush(); system("sleep 1000") }`}})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the memory holder to be ready", func() bool {
		st, err := p.Client.Attach(ctx, sb.ID, hold.ID, 0, false)
		if err != nil {
			return false
		}
		defer st.Close()
		ev, err := st.Next()
		return err == nil && string(ev.Data) == "ready\n"
	})

	paused, err := p.Client.PauseSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if paused.State != corral.StatePaused || paused.LastPause == nil {
		t.Fatalf("after pause: %+v", paused)
	}
	lp := paused.LastPause
	t.Logf("pause took %.1f ms, memory %d -> %d bytes (returned %d), swap on host: %v", lp.TookMs, lp.MemoryBefore, lp.MemoryAfter, lp.MemoryReturned, hostHasSwap())
	if hostHasSwap() && lp.MemoryReturned < 230<<20 {
		t.Fatalf("returned %d bytes of a sandbox holding 256 MiB; want at least 90%%", lp.MemoryReturned)
	}
	if _, err := p.Client.PauseSandbox(ctx, sb.ID); !corral.IsConflict(err) {
		t.Fatalf("pause of a paused sandbox: %v, want conflict", err)
	}
	got, _ := p.Client.GetSandbox(ctx, sb.ID)
	if got.State != corral.StatePaused {
		t.Fatalf("get does not resume: state %s", got.State)
	}

	// A restart keeps it paused; an exec then resumes it transparently, processes and files intact.
	p.Kill9()
	p.Restart()
	got, _ = p.Client.GetSandbox(ctx, sb.ID)
	if got.State != corral.StatePaused {
		t.Fatalf("after kill -9 and restart: state %s, want paused", got.State)
	}
	if out := p.sh(sb.ID, "cat /root/file; pidof awk >/dev/null && echo holder-alive"); out != "kept\nholder-alive\n" {
		t.Fatalf("after transparent resume: %q", out)
	}
	got, _ = p.Client.GetSandbox(ctx, sb.ID)
	if got.State != corral.StateRunning {
		t.Fatalf("after an exec on a paused sandbox: state %s, want running", got.State)
	}
	if _, err := p.Client.ResumeSandbox(ctx, sb.ID); !corral.IsConflict(err) {
		t.Fatalf("resume of a running sandbox: %v, want conflict", err)
	}
	// GET ?wait=running resumes too.
	if _, err := p.Client.PauseSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", p.URL+"/v1/sandboxes/"+sb.ID+"?wait=running", nil)
	req.Header.Set("Authorization", "Bearer "+p.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var waited corral.Sandbox
	json.NewDecoder(resp.Body).Decode(&waited)
	resp.Body.Close()
	if waited.State != corral.StateRunning {
		t.Fatalf("GET ?wait=running on a paused sandbox: state %s", waited.State)
	}
	// A step still running when the sandbox pauses is recorded to its end: the edge's recording
	// outlives the pause (under gVisor the pause cuts every connection to the agent).
	if _, err := p.Client.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo before; sleep 1; echo after"}, StepID: "across-pause"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := p.Client.PauseSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Client.ResumeSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the step begun before the pause to be recorded as done", func() bool {
		log, err := p.Client.Trajectory(ctx, sb.ID, 0)
		if err != nil {
			return false
		}
		for _, e := range log {
			if e.StepID != "across-pause" || e.State == corral.StepRunning {
				continue
			}
			var out string
			for _, ev := range e.Output {
				out += string(ev.Data)
			}
			if e.State != corral.StepDone || out != "before\nafter\n" {
				t.Fatalf("step across a pause: state %s, output %q, error %q", e.State, out, e.Error)
			}
			return true
		}
		return false
	})
	// Explicit pause and resume, then delete a paused sandbox: nothing left.
	if _, err := p.Client.PauseSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if r, err := p.Client.ResumeSandbox(ctx, sb.ID); err != nil || r.State != corral.StateRunning {
		t.Fatalf("resume: %+v, %v", r, err)
	}
	if _, err := p.Client.PauseSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	p.Stop()
	assertNoLeftovers(t, p)
}

// TestAutoPause: an idle sandbox with auto_pause_after pauses instead of stopping, and wakes up on use.
func TestAutoPause(t *testing.T) {
	p := withBase(t)
	ctx := context.Background()
	keep := false
	sb := p.create(corral.CreateRequest{AutoPauseAfter: "1s", TTL: "1h", PauseKeepsTTL: &keep})
	eventually(t, 10*time.Second, "the idle sandbox to pause by itself", func() bool {
		got, err := p.Client.GetSandbox(ctx, sb.ID)
		return err == nil && got.State == corral.StatePaused && got.LastPause != nil && got.LastPause.AutomaticPause
	})
	time.Sleep(1500 * time.Millisecond)
	if out := p.sh(sb.ID, "echo awake"); out != "awake\n" {
		t.Fatalf("exec after auto-pause: %q", out)
	}
	got, _ := p.Client.GetSandbox(ctx, sb.ID)
	if !got.ExpiresAt.After(sb.ExpiresAt.Add(time.Second)) {
		t.Fatalf("pause_keeps_ttl=false: expiry %s did not move past %s", got.ExpiresAt, sb.ExpiresAt)
	}
}
