package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// soakSample is what the soak watches for growth.
type soakSample struct {
	At                      time.Duration
	FDs, Goroutines, Thread int
	RSS                     int64
	Mounts, Loops, Running  int
}

func (s soakSample) String() string {
	return fmt.Sprintf("t=%-6s fds=%d goroutines=%d threads=%d rss=%dMiB mounts=%d loops=%d running=%d",
		s.At.Round(time.Second), s.FDs, s.Goroutines, s.Thread, s.RSS>>20, s.Mounts, s.Loops, s.Running)
}

// sampleSoak reads corral up's fds, goroutines (from /v1/metrics), threads and RSS, and the
// host's mounts and loop devices of its data dir.
func sampleSoak(t *testing.T, p *corralProc, since time.Time) soakSample {
	t.Helper()
	pid := p.cmd.Process.Pid
	s := soakSample{At: time.Since(since), RSS: procRSS(pid)}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	s.FDs = len(fds)
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "Threads:" {
				s.Thread, _ = strconv.Atoi(f[1])
			}
		}
	}
	req, _ := http.NewRequest(http.MethodGet, p.URL+"/v1/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+p.Token)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
				s.Goroutines, _ = strconv.Atoi(v)
			}
		}
		resp.Body.Close()
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
		if strings.Contains(line, p.DataDir) {
			s.Mounts++
		}
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range loops {
		if b, _ := os.ReadFile(f); strings.Contains(string(b), p.DataDir) {
			s.Loops++
		}
	}
	if list, err := p.Client.ListSandboxes(context.Background(), corral.ListOptions{}); err == nil {
		for _, sb := range list {
			if sb.State == corral.StateRunning {
				s.Running++
			}
		}
	}
	return s
}

// TestSoak (make soak; not in CI) runs mixed load for $CORRAL_SOAK (a Go duration, e.g. 1h or
// 10m): the fault suite's load (creates, execs with output, file writes, deletes) plus, every
// 30 s, commands whose output nobody reads and a download nobody finishes. It samples corral
// up's fds, goroutines, threads and RSS and the data dir's mounts and loop devices idle before,
// every minute under load, and idle after; it fails if an idle figure ends above its start by
// more than a fixed margin (mounts and loop devices: by any), or the load lost anything.
func TestSoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("CORRAL_SOAK"))
	if err != nil || d <= 0 {
		t.Skip("set CORRAL_SOAK to a duration (make soak SOAK=10m) to run the soak")
	}
	p := withBase(t)
	ctx := context.Background()
	since := time.Now()
	quiet := func() soakSample {
		// Idle: no sandbox, pools refilled, background work settled.
		eventually(t, time.Minute, "no sandbox running", func() bool {
			list, err := p.Client.ListSandboxes(ctx, corral.ListOptions{})
			if err != nil {
				return false
			}
			for _, sb := range list {
				if sb.State == corral.StateRunning || sb.State == corral.StateCreating {
					return false
				}
			}
			return true
		})
		runFor(5 * time.Second)
		return sampleSoak(t, p, since)
	}
	// A first sandbox made and deleted warms what stays for the process's life (the layer
	// mount, the disk pool, the agent's HTTP connections) before the idle baseline.
	sb := p.create(corral.CreateRequest{Limits: faultLimits})
	p.sh(sb.ID, "echo warm")
	p.Client.DeleteSandbox(ctx, sb.ID)
	before := quiet()
	t.Logf("SOAK idle before: %s", before)

	l := newFaultLoad(t, p.Token, p.URL).start()
	end := time.Now().Add(d)
	nextSample, nextBurst := time.Now().Add(time.Minute), time.Now().Add(30*time.Second)
	var samples []soakSample
	for time.Now().Before(end) {
		runFor(time.Second)
		if time.Now().After(nextBurst) {
			nextBurst = time.Now().Add(30 * time.Second)
			soakBurst(t, p)
		}
		if time.Now().After(nextSample) {
			nextSample = time.Now().Add(time.Minute)
			s := sampleSoak(t, p, since)
			samples = append(samples, s)
			t.Logf("SOAK under load: %s", s)
		}
	}
	l.stop()
	r := l.verify(p.Client)
	r.log(t, fmt.Sprintf("soak of %s", d))
	list, _ := p.Client.ListSandboxes(ctx, corral.ListOptions{})
	for _, sb := range list {
		if sb.State == corral.StateRunning {
			p.Client.DeleteSandbox(ctx, sb.ID)
		}
	}
	after := quiet()
	t.Logf("SOAK idle after: %s", after)
	for _, c := range []struct {
		what          string
		before, after int64
		margin        int64
	}{
		{"fds", int64(before.FDs), int64(after.FDs), 16},
		{"goroutines", int64(before.Goroutines), int64(after.Goroutines), 32},
		{"threads", int64(before.Thread), int64(after.Thread), 16},
		{"RSS MiB", before.RSS >> 20, after.RSS >> 20, max(64, before.RSS>>20)},
		{"mounts", int64(before.Mounts), int64(after.Mounts), 0},
		{"loop devices", int64(before.Loops), int64(after.Loops), 0},
	} {
		if c.after > c.before+c.margin {
			t.Errorf("%s grew from %d to %d over a %s soak (margin %d)", c.what, c.before, c.after, d, c.margin)
		}
	}
	p.Stop()
	assertNoLeftovers(t, p)
}

// soakBurst makes a sandbox, starts three commands printing without end and a 16 MiB download,
// reads none of them for a few seconds, then closes them and deletes the sandbox.
func soakBurst(t *testing.T, p *corralProc) {
	ctx := context.Background()
	sb, err := p.Client.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Limits: faultLimits})
	if err != nil {
		t.Logf("soak burst: create: %v", err)
		return
	}
	defer p.Client.DeleteSandbox(ctx, sb.ID)
	var closers []interface{ Close() error }
	for range 3 {
		if st, err := p.Client.Exec(ctx, sb.ID, corral.ExecRequest{Argv: []string{"sh", "-c", "while :; do echo unread unread unread; done"}}); err == nil {
			closers = append(closers, st)
		}
	}
	if _, _, exit, err := p.Client.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"sh", "-c", "head -c 16m /dev/zero > /root/big"}}); err == nil && exit.Code == 0 {
		if rc, err := p.Client.ReadFile(ctx, sb.ID, "/root/big"); err == nil {
			closers = append(closers, rc)
		}
	}
	runFor(5 * time.Second)
	for _, c := range closers {
		c.Close()
	}
}
