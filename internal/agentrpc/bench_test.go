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
// dial to the exit event (p50-µs, p99-µs). Each iteration also forks, execs and reaps /bin/true
// through the same reaper without the protocol, pipes or output (bare-p50-µs); overhead-p50-µs
// is the median of the paired differences, the agent's own share, which stays meaningful on a
// busy machine where fork and exec alone vary by milliseconds. cpu-overhead-µs/op is the process
// CPU time (client and agent together, all threads) an Exec costs beyond the bare run, which
// scheduling delays on a loaded machine do not inflate.
func BenchmarkExecTrue(b *testing.B) {
	c, _ := startServer(b, nil)
	ctx := context.Background()
	attr := &syscall.ProcAttr{Env: []string{"PATH=/bin"}, Files: []uintptr{0, 1, 2}, Sys: &syscall.SysProcAttr{Setpgid: true}}
	var lat, bare, diff []time.Duration
	var bareCPU, execCPU time.Duration
	for b.Loop() {
		c0 := cpuTime()
		t0 := time.Now()
		w := newProcWaiter()
		if _, err := procReaper.start(func() (int, error) {
			return syscall.ForkExec("/bin/true", []string{"true"}, attr)
		}, w); err != nil {
			b.Fatal(err)
		}
		<-w.ch
		t1 := time.Now()
		c1 := cpuTime()
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
		t2 := time.Now()
		c2 := cpuTime()
		bareCPU += c1 - c0
		execCPU += c2 - c1
		bare = append(bare, t1.Sub(t0))
		lat = append(lat, t2.Sub(t1))
		diff = append(diff, t2.Sub(t1)-t1.Sub(t0))
	}
	reportPercentiles(b, lat)
	if len(bare) > 0 {
		slices.Sort(bare)
		slices.Sort(diff)
		b.ReportMetric(float64(bare[len(bare)/2].Microseconds()), "bare-p50-µs")
		b.ReportMetric(float64(diff[len(diff)/2].Microseconds()), "overhead-p50-µs")
		b.ReportMetric(float64((execCPU-bareCPU).Microseconds())/float64(len(lat)), "cpu-overhead-µs/op")
	}
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

// cpuTime returns the user and system CPU time used so far by this process's threads.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
