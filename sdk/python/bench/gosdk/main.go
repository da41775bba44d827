// Command gosdk is the Go SDK side of the Python SDK benchmark (sdk/python/bench/bench.py): the
// same measurements made with sdk/go against the same server, printed as JSON.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

func main() {
	base := flag.String("base", "base:bench", "base layer of the sandboxes")
	creates := flag.Int("creates", 30, "create → first exec samples")
	execs := flag.Int("execs", 200, "exec round trip samples")
	fleet := flag.Int("fleet", 0, "sandboxes created, exec'd in and deleted concurrently (0: skip)")
	flag.Parse()
	if err := run(*base, *creates, *execs, *fleet); err != nil {
		fmt.Fprintln(os.Stderr, "gosdk:", err)
		os.Exit(1)
	}
}

// result is what bench.py reads.
type result struct {
	CreateExecMs []float64 `json:"create_exec_ms"`
	ExecMs       []float64 `json:"exec_ms"`
	FleetWallS   float64   `json:"fleet_wall_s,omitempty"`
	FleetCPUS    float64   `json:"fleet_cpu_s,omitempty"`
}

func run(base string, creates, execs, fleet int) error {
	ctx := context.Background()
	c := corral.New(os.Getenv("CORRAL_URL"), os.Getenv("CORRAL_TOKEN"))
	var res result
	one := func() (*corral.Sandbox, error) {
		return c.CreateSandbox(ctx, corral.CreateRequest{Base: base, TTL: "10m"})
	}
	exec := func(id string) error {
		_, _, exit, err := c.Run(ctx, id, corral.ExecRequest{Argv: []string{"true"}})
		if err == nil && exit.Code != 0 {
			err = fmt.Errorf("true exited %d", exit.Code)
		}
		return err
	}
	for range creates {
		t0 := time.Now()
		sb, err := one()
		if err != nil {
			return err
		}
		if err := exec(sb.ID); err != nil {
			return err
		}
		res.CreateExecMs = append(res.CreateExecMs, ms(time.Since(t0)))
		if _, err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			return err
		}
	}
	sb, err := one()
	if err != nil {
		return err
	}
	for range execs {
		t0 := time.Now()
		if err := exec(sb.ID); err != nil {
			return err
		}
		res.ExecMs = append(res.ExecMs, ms(time.Since(t0)))
	}
	if _, err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		return err
	}
	if fleet > 0 {
		cpu0 := cpuSeconds()
		t0 := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, fleet)
		for range fleet {
			wg.Go(func() {
				sb, err := one()
				if err == nil {
					err = exec(sb.ID)
					if _, derr := c.DeleteSandbox(ctx, sb.ID); err == nil {
						err = derr
					}
				}
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				return err
			}
		}
		res.FleetWallS, res.FleetCPUS = time.Since(t0).Seconds(), cpuSeconds()-cpu0
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// cpuSeconds is the user and system CPU this process used so far.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
