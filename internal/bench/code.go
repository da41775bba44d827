package bench

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// CodeConfig sizes a code-interpreter benchmark run.
type CodeConfig struct {
	Env     string // the code-interpreter environment (corral env install code-interpreter)
	Creates int    // sandboxes created, each measured to its first run
	Rounds  int    // runCode('1+1') round trips on one sandbox
}

// CodeResult compares a code-interpreter sandbox's create→first run and run round trip with the
// same Python work done by an exec in the same sandbox, alternating.
type CodeResult struct {
	Date string `json:"date"`
	// CreateToFirst: create of a sandbox of the environment → the first run's result ("1+1").
	CreateToFirst Stats `json:"create_to_first_run"`
	// Create alone, the part of CreateToFirst the create call takes (it waits for the server).
	Create Stats `json:"create"`
	// CreateToExec: create → first `python3 -c 1+1` exec result in a sandbox of the same
	// environment (the baseline: Python started cold, no kernel).
	CreateToExec Stats `json:"create_to_first_exec_python"`
	// Run: runCode('1+1') round trips in a warm context; Exec: `python3 -c 1+1` execs.
	Run      Stats   `json:"run_code_1plus1"`
	Exec     Stats   `json:"exec_python_1plus1"`
	RatioRun float64 `json:"ratio_run_p50"`
	// RatioFirst is CreateToFirst / CreateToExec at p50.
	RatioFirst float64 `json:"ratio_create_to_first_p50"`
}

// Code measures a code-interpreter environment: create→first runCode result against create→first
// `python3 -c 1+1` exec, and the runCode('1+1') round trip against an exec of `python3 -c 1+1`.
func Code(ctx context.Context, c *corral.Client, cfg CodeConfig, log *slog.Logger) (*CodeResult, error) {
	res := &CodeResult{Date: time.Now().UTC().Format(time.RFC3339)}
	var first, create, firstExec []time.Duration
	log.Info("measuring create → first result", "env", cfg.Env, "creates", cfg.Creates)
	for i := range cfg.Creates {
		for _, code := range []bool{true, false} {
			start := time.Now()
			sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Environment: cfg.Env, TTL: "10m"})
			if err != nil {
				return nil, fmt.Errorf("create %d: %w", i, err)
			}
			created := time.Since(start)
			if code {
				ex, err := c.RunCode(ctx, sb.ID, corral.CodeRequest{Code: "1+1"}, nil)
				if err != nil || ex.Text() != "2" {
					c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
					return nil, fmt.Errorf("first run in %s: %v %+v", sb.ID, err, ex)
				}
				first = append(first, time.Since(start))
				create = append(create, created)
			} else {
				out, _, exit, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"python3", "-c", "print(1+1)"}})
				if err != nil || exit == nil || exit.Code != 0 || string(out) != "2\n" {
					c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
					return nil, fmt.Errorf("first exec in %s: %v %+v", sb.ID, err, exit)
				}
				firstExec = append(firstExec, time.Since(start))
			}
			c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
		}
	}
	sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Environment: cfg.Env, TTL: "10m"})
	if err != nil {
		return nil, err
	}
	defer c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
	log.Info("measuring round trips: runCode vs exec", "rounds", cfg.Rounds)
	var run, exec []time.Duration
	for range cfg.Rounds {
		start := time.Now()
		ex, err := c.RunCode(ctx, sb.ID, corral.CodeRequest{Code: "1+1"}, nil)
		if err != nil || ex.Text() != "2" {
			return nil, fmt.Errorf("run: %v %+v", err, ex)
		}
		run = append(run, time.Since(start))
		start = time.Now()
		_, _, exit, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"python3", "-c", "1+1"}})
		if err != nil || exit == nil || exit.Code != 0 {
			return nil, fmt.Errorf("exec: %v %+v", err, exit)
		}
		exec = append(exec, time.Since(start))
	}
	res.CreateToFirst, res.Create, res.CreateToExec = summarise(first), summarise(create), summarise(firstExec)
	res.Run, res.Exec = summarise(run), summarise(exec)
	res.RatioRun = ratio(res.Run.P50, res.Exec.P50)
	res.RatioFirst = ratio(res.CreateToFirst.P50, res.CreateToExec.P50)
	return res, nil
}
