package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// ForkConfig sizes a fork benchmark run.
type ForkConfig struct {
	Base    string
	Runtime string // of the source and the creates: "gvisor" or "microvm" (memory and processes), or "runc" (disk only)
	HeldMiB int    // anonymous memory the source's process holds
	Counts  []int  // copies per fork, one measure each
	Rounds  int    // forks (and as many batches of creates) per count
}

// ForkCount is what forks of one size measured.
type ForkCount struct {
	N int `json:"n"`
	// Fork is the time from the fork call until every copy answered an exec; Create is the
	// time from N concurrent creates until every sandbox answered one (the baseline asked for);
	// CreateHold is N creates until each has rebuilt the source's state (its process holding
	// the memory), what a fork saves.
	Fork            Stats   `json:"fork_ready"`
	Create          Stats   `json:"create_ready"`
	CreateHold      Stats   `json:"create_and_hold_ready"`
	Ratio           float64 `json:"fork_create_ratio_p50"`
	CreateHoldRatio float64 `json:"fork_create_and_hold_ratio_p50"`
	// HostMiBPerCopy is the host memory the copies took (MemAvailable before and after, per
	// copy; noisy on a shared host) and CopyCgroupMiB a copy's own memory cgroup.
	HostMiBPerCopy float64 `json:"host_mib_per_copy"`
	CopyCgroupMiB  float64 `json:"copy_cgroup_mib"`
}

// ForkResult is what one fork run measured.
type ForkResult struct {
	Date      string      `json:"date"`
	Runtime   string      `json:"runtime"`
	HeldMiB   int         `json:"held_mib"`
	SourceMiB float64     `json:"source_cgroup_mib"`
	Counts    []ForkCount `json:"counts"`
}

// Fork measures the time to N ready copies of a sandbox holding cfg.HeldMiB against N creates
// from scratch, and the host memory N copies take.
func Fork(ctx context.Context, c *corral.Client, cfg ForkConfig, log *slog.Logger) (*ForkResult, error) {
	res := &ForkResult{Date: time.Now().UTC().Format(time.RFC3339), Runtime: cfg.Runtime, HeldMiB: cfg.HeldMiB}
	mem := int64(cfg.HeldMiB)*3<<20 + 256<<20
	create := corral.CreateRequest{Base: cfg.Base, Runtime: cfg.Runtime, Limits: corral.Limits{MemoryBytes: mem}}
	if cfg.Runtime == "microvm" {
		create.Tier, create.Runtime = "microvm", ""
	}
	src, err := c.CreateSandbox(ctx, create)
	if err != nil {
		return nil, err
	}
	defer c.DeleteSandbox(context.WithoutCancel(ctx), src.ID)
	hold := fmt.Sprintf(`BEGIN { s = "x"; while (length(s) < %d) s = s s; print "ready"; fflush(); system("sleep 100000") }`, cfg.HeldMiB<<20)
	if err := holdAll(ctx, c, []string{src.ID}, hold); err != nil {
		return nil, err
	}
	res.SourceMiB = cgroupMiB(ctx, c, src.ID)
	diskOnly := cfg.Runtime == "runc"
	for _, n := range cfg.Counts {
		fc := ForkCount{N: n}
		var forks, creates, holds []time.Duration
		var hostMiB, cgMiB []float64
		for round := range cfg.Rounds {
			log.Info("measuring a fork", "copies", n, "round", round)
			before := memAvailableMiB()
			start := time.Now()
			copies, err := c.Fork(ctx, src.ID, corral.ForkRequest{Count: n, DiskOnly: diskOnly})
			if err != nil {
				return nil, fmt.Errorf("fork %d copies: %w", n, err)
			}
			ids := make([]string, len(copies))
			for i, s := range copies {
				ids[i] = s.ID
			}
			err = execAll(ctx, c, ids)
			forks = append(forks, time.Since(start))
			if err == nil {
				hostMiB = append(hostMiB, (before-memAvailableMiB())/float64(n))
				cgMiB = append(cgMiB, cgroupMiB(ctx, c, ids[0]))
			}
			deleteAll(ctx, c, ids)
			if err != nil {
				return nil, err
			}

			log.Info("measuring creates from scratch", "count", n, "round", round)
			start = time.Now()
			ids, err = createAll(ctx, c, n, create)
			if err == nil {
				err = execAll(ctx, c, ids)
			}
			creates = append(creates, time.Since(start))
			deleteAll(ctx, c, ids)
			if err != nil {
				return nil, err
			}

			log.Info("measuring creates that rebuild the state", "count", n, "round", round)
			start = time.Now()
			ids, err = createAll(ctx, c, n, create)
			if err == nil {
				err = holdAll(ctx, c, ids, hold)
			}
			holds = append(holds, time.Since(start))
			deleteAll(ctx, c, ids)
			if err != nil {
				return nil, err
			}
		}
		fc.Fork, fc.Create = summarise(forks), summarise(creates)
		fc.CreateHold = summarise(holds)
		fc.Ratio = fc.Fork.P50 / fc.Create.P50
		fc.CreateHoldRatio = fc.Fork.P50 / fc.CreateHold.P50
		fc.HostMiBPerCopy, fc.CopyCgroupMiB = median(hostMiB), median(cgMiB)
		res.Counts = append(res.Counts, fc)
	}
	return res, nil
}

// holdAll starts the awk program hold in every sandbox at once and waits until each is ready.
func holdAll(ctx context.Context, c *corral.Client, ids []string, hold string) error {
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd, err := c.StartCommand(ctx, id, corral.ExecRequest{Argv: []string{"awk", hold}})
			if err == nil {
				// All at once on the host's cores: the wait grows with their number.
				err = waitOutput(ctx, c, id, cmd.ID, "ready\n", 2*time.Minute+time.Duration(len(ids))*15*time.Second)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// waitOutput waits until command cid of sandbox id has written want.
func waitOutput(ctx context.Context, c *corral.Client, id, cid, want string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		st, err := c.Attach(ctx, id, cid, 0, false)
		if err == nil {
			ev, err := st.Next()
			st.Close()
			if err == nil && string(ev.Data) == want {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("sandbox %s: command %s did not write %q within %v", id, cid, want, within)
}

// execAll runs true in every sandbox at once and waits for all.
func execAll(ctx context.Context, c *corral.Client, ids []string) error {
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, _, errs[i] = c.Run(ctx, id, corral.ExecRequest{Argv: []string{"true"}})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// createAll creates n sandboxes of req at once (8 at a time) and returns those made.
func createAll(ctx context.Context, c *corral.Client, n int, req corral.CreateRequest) ([]string, error) {
	ids := make([]string, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			sb, err := c.CreateSandbox(ctx, req)
			if err == nil {
				ids[i] = sb.ID
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	var made []string
	for _, id := range ids {
		if id != "" {
			made = append(made, id)
		}
	}
	for _, err := range errs {
		if err != nil {
			return made, err
		}
	}
	return made, nil
}

// cgroupMiB is the newest memory sample the node took of sandbox id, waiting up to 10 s for
// one taken from now on.
func cgroupMiB(ctx context.Context, c *corral.Client, id string) float64 {
	since := time.Now()
	deadline := since.Add(10 * time.Second)
	for time.Now().Before(deadline) {
		m, err := c.SandboxMetrics(ctx, id, since)
		if err == nil && len(m.Samples) > 0 {
			return float64(m.Samples[len(m.Samples)-1].MemoryBytes) / (1 << 20)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return 0
}

// memAvailableMiB is the host's MemAvailable.
func memAvailableMiB() float64 {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			return kb / 1024
		}
	}
	return 0
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
