package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// UserNSConfig sizes `corral bench userns`.
type UserNSConfig struct {
	Base       string // layer NAME:VERSION, on both servers
	TTIRounds  int    // create→first exec samples per server
	ExecRounds int    // exec round trips per server
}

// UserNSResult compares two `corral up` on one host, one giving container sandboxes user
// namespaces (the default) and one started with --no-userns, sampled alternately so both see
// the same load.
type UserNSResult struct {
	Date   string `json:"date"`
	Host   string `json:"host"`
	UserNS string `json:"userns"`
	// TTIWith and TTIWithout are create→first exec (`true`) with and without user namespaces.
	TTIWith     Stats   `json:"tti_with_userns"`
	TTIWithout  Stats   `json:"tti_without_userns"`
	TTIRatioP50 float64 `json:"tti_ratio_p50"`
	TTIRatioP99 float64 `json:"tti_ratio_p99"`
	// ExecWith and ExecWithout are exec round trips (`true`) in a running sandbox.
	ExecWith     Stats   `json:"exec_with_userns"`
	ExecWithout  Stats   `json:"exec_without_userns"`
	ExecRatioP50 float64 `json:"exec_ratio_p50"`
	ExecRatioP99 float64 `json:"exec_ratio_p99"`
}

// UserNS measures what user namespaces (and the idmapped mounts they bring) cost a sandbox's
// creation and an exec. with must give sandboxes user namespaces, without must not (corral up
// --no-userns); both on this host.
func UserNS(ctx context.Context, with, without *corral.Client, cfg UserNSConfig, log *slog.Logger) (*UserNSResult, error) {
	wi, err := with.Info(ctx)
	if err != nil {
		return nil, err
	}
	wo, err := without.Info(ctx)
	if err != nil {
		return nil, err
	}
	if wi.UserNS == "" {
		return nil, fmt.Errorf("the server measured with user namespaces runs without: %s", wi.UserNSUnavailable)
	}
	if wo.UserNS != "" {
		return nil, fmt.Errorf("the server measured without user namespaces has them (start it with --no-userns)")
	}
	host, _ := os.Hostname()
	res := &UserNSResult{Date: time.Now().UTC().Format(time.RFC3339), Host: host, UserNS: wi.UserNS}
	clients := []*corral.Client{with, without}
	for _, c := range clients { // warm up
		if _, err := ttiOnce(ctx, c, cfg.Base); err != nil {
			return nil, err
		}
	}
	log.Info("measuring create→first exec with and without user namespaces", "rounds", cfg.TTIRounds)
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
