package bench

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// ExclusiveConfig sizes an exclusive-exec benchmark run.
type ExclusiveConfig struct {
	Base     string   // the base layer NAME:VERSION
	Runtimes []string // runc, gvisor, microvm (the microvm tier)
	Rounds   int      // exec round trips each way, per runtime
	Idle     int      // idle background processes in the sandbox, which an exclusive exec stops and continues
}

// ExclusiveResult compares, per runtime, an exclusive exec of `true` with a plain one in the same
// sandbox, alternating.
type ExclusiveResult struct {
	Date     string                     `json:"date"`
	Idle     int                        `json:"idle_processes"`
	Runtimes map[string]ExclusiveFigure `json:"runtimes"`
}

// ExclusiveFigure is one runtime's measure.
type ExclusiveFigure struct {
	Plain     Stats   `json:"exec_plain"`
	Exclusive Stats   `json:"exec_exclusive"`
	RatioP50  float64 `json:"ratio_p50"`
	RatioP99  float64 `json:"ratio_p99"`
	// Error says why the runtime could not be measured (the others still are).
	Error string `json:"error,omitempty"`
}

// Exclusive measures the round trip of `corral exec --exclusive ... -- true` against a plain exec
// of `true` in a sandbox holding cfg.Idle sleeping processes (which the exclusive exec stops,
// rescans and continues), per runtime.
func Exclusive(ctx context.Context, c *corral.Client, cfg ExclusiveConfig, log *slog.Logger) (*ExclusiveResult, error) {
	res := &ExclusiveResult{Date: time.Now().UTC().Format(time.RFC3339), Idle: cfg.Idle, Runtimes: make(map[string]ExclusiveFigure)}
	for _, rt := range cfg.Runtimes {
		req := corral.CreateRequest{Base: cfg.Base, Runtime: rt}
		if rt == "microvm" {
			req = corral.CreateRequest{Base: cfg.Base, Tier: "microvm", Limits: corral.Limits{MemoryBytes: 256 << 20}}
		}
		sb, err := c.CreateSandbox(ctx, req)
		if err != nil {
			log.Error("runtime not measured", "runtime", rt, "err", err)
			res.Runtimes[rt] = ExclusiveFigure{Error: fmt.Sprintf("create a %s sandbox: %v", rt, err)}
			continue
		}
		fig, err := exclusiveRounds(ctx, c, sb.ID, cfg, rt, log)
		c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", rt, err)
		}
		res.Runtimes[rt] = fig
	}
	return res, nil
}

func exclusiveRounds(ctx context.Context, c *corral.Client, id string, cfg ExclusiveConfig, rt string, log *slog.Logger) (ExclusiveFigure, error) {
	for i := range cfg.Idle {
		if _, err := c.StartCommand(ctx, id, corral.ExecRequest{Argv: []string{"sleep", "3600"}}); err != nil {
			return ExclusiveFigure{}, fmt.Errorf("idle process %d: %w", i, err)
		}
	}
	log.Info("measuring exec round trips: plain vs exclusive", "runtime", rt, "rounds", cfg.Rounds, "idle", cfg.Idle)
	var plain, excl []time.Duration
	for range cfg.Rounds {
		for _, exclusive := range []bool{false, true} {
			start := time.Now()
			_, _, exit, err := c.Run(ctx, id, corral.ExecRequest{Argv: []string{"true"}, Exclusive: exclusive})
			if err != nil || exit == nil || exit.Code != 0 {
				return ExclusiveFigure{}, fmt.Errorf("exec (exclusive %v): %v %+v", exclusive, err, exit)
			}
			if exclusive {
				excl = append(excl, time.Since(start))
			} else {
				plain = append(plain, time.Since(start))
			}
		}
	}
	fig := ExclusiveFigure{Plain: summarise(plain), Exclusive: summarise(excl)}
	fig.RatioP50 = ratio(fig.Exclusive.P50, fig.Plain.P50)
	fig.RatioP99 = ratio(fig.Exclusive.P99, fig.Plain.P99)
	return fig, nil
}
