package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TracingConfig sizes `corral bench trace`.
type TracingConfig struct {
	Base       string // layer NAME:VERSION, on both servers
	TTIRounds  int    // create→first exec samples per server
	ExecRounds int    // exec round trips per server
}

// TracingResult compares two `corral up` on one host, one exporting traces over OTLP
// (--otlp-endpoint) and one without, sampled alternately so both see the same load.
type TracingResult struct {
	Date string `json:"date"`
	Host string `json:"host"`
	// TTIWith and TTIWithout are create→first exec (`true`) with and without tracing.
	TTIWith     Stats   `json:"tti_with_tracing"`
	TTIWithout  Stats   `json:"tti_without_tracing"`
	TTIRatioP50 float64 `json:"tti_ratio_p50"`
	TTIRatioP99 float64 `json:"tti_ratio_p99"`
	// ExecWith and ExecWithout are exec round trips (`true`) in a running sandbox.
	ExecWith     Stats   `json:"exec_with_tracing"`
	ExecWithout  Stats   `json:"exec_without_tracing"`
	ExecRatioP50 float64 `json:"exec_ratio_p50"`
	ExecRatioP99 float64 `json:"exec_ratio_p99"`
}

// Tracing measures what tracing costs a sandbox's creation and an exec. with must export traces
// (corral up --otlp-endpoint), without must not; both on this host.
func Tracing(ctx context.Context, with, without *corral.Client, cfg TracingConfig, log *slog.Logger) (*TracingResult, error) {
	host, _ := os.Hostname()
	res := &TracingResult{Date: time.Now().UTC().Format(time.RFC3339), Host: host}
	clients := []*corral.Client{with, without}
	for _, c := range clients { // warm up
		if _, err := ttiOnce(ctx, c, cfg.Base); err != nil {
			return nil, err
		}
	}
	log.Info("measuring create→first exec with and without tracing", "rounds", cfg.TTIRounds)
	tti := make([][]time.Duration, 2)
	for range cfg.TTIRounds {
		for i, c := range clients {
			d, err := ttiOnce(ctx, c, cfg.Base)
			if err != nil {
				return nil, err
			}
			tti[i] = append(tti[i], d)
		}
	}
	res.TTIWith, res.TTIWithout = summarise(tti[0]), summarise(tti[1])
	res.TTIRatioP50, res.TTIRatioP99 = res.TTIWith.P50/res.TTIWithout.P50, res.TTIWith.P99/res.TTIWithout.P99

	log.Info("measuring exec round trips", "rounds", cfg.ExecRounds)
	var ids [2]string
	for i, c := range clients {
		sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: cfg.Base})
		if err != nil {
			return nil, err
		}
		defer c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
		ids[i] = sb.ID
	}
	execs := make([][]time.Duration, 2)
	for range cfg.ExecRounds {
		for i, c := range clients {
			start := time.Now()
			if _, _, exit, err := c.Run(ctx, ids[i], corral.ExecRequest{Argv: []string{"true"}}); err != nil || exit == nil || exit.Code != 0 {
				return nil, fmt.Errorf("exec: %v %+v", err, exit)
			}
			execs[i] = append(execs[i], time.Since(start))
		}
	}
	res.ExecWith, res.ExecWithout = summarise(execs[0]), summarise(execs[1])
	res.ExecRatioP50, res.ExecRatioP99 = res.ExecWith.P50/res.ExecWithout.P50, res.ExecWith.P99/res.ExecWithout.P99
	return res, nil
}
