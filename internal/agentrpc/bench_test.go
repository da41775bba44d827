package agentrpc

import (
	"context"
	"io"
	"slices"
	"syscall"
	"testing"
	"time"
)

// BenchmarkExecTrue measures the hot path: one Exec of /bin/true over a real unix socket, from
// dial to the exit event. It reports p50 and p99 besides the mean; compare with
// BenchmarkForkExecTrue (the process alone) for the agent's own share.
func BenchmarkExecTrue(b *testing.B) {
	c, _ := startServer(b, nil)
	ctx := context.Background()
	var lat []time.Duration
	for b.Loop() {
		t0 := time.Now()
		s, err := c.Exec(ctx, ExecRequest{Argv: []string{"/bin/true"}})
		if err != nil {
			b.Fatal(err)
		}
		for {
			ev, err := s.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			if ev.Type == EventExit && ev.Exit.Code != 0 {
				b.Fatalf("exit %+v", ev.Exit)
			}
		}
		s.Close()
		lat = append(lat, time.Since(t0))
	}
	reportPercentiles(b, lat)
}

// BenchmarkForkExecTrue is the baseline: fork, exec and reap /bin/true with no agent involved.
// It must not run while a Server (and so the reaper) is active: it waits for its own child.
func BenchmarkForkExecTrue(b *testing.B) {
	var lat []time.Duration
	attr := &syscall.ProcAttr{Env: []string{"PATH=/bin"}, Sys: &syscall.SysProcAttr{Setpgid: true}}
	for b.Loop() {
		t0 := time.Now()
		pid, err := syscall.ForkExec("/bin/true", []string{"true"}, attr)
		if err != nil {
			b.Fatal(err)
		}
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	reportPercentiles(b, lat)
}

// BenchmarkPing is the protocol round trip alone: dial, request, reply.
func BenchmarkPing(b *testing.B) {
	c, _ := startServer(b, nil)
	ctx := context.Background()
	var lat []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := c.Ping(ctx); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	reportPercentiles(b, lat)
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
