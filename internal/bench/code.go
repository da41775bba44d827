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
	// Warm, when above 0, also measures create→first runCode from a warm pool of that many
	// sandboxes of the environment (set on the environment for the run, then restored): each
	// create waits until the pool has a sandbox ready, so each is a claim.
	Warm int
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
	// WarmToFirst: with a warm pool (Warm), create (a claim) → the first run's result, and
	// WarmCreate the create alone; WarmClaims counts the creates the pool served (of Creates).
	WarmToFirst *Stats `json:"warm_create_to_first_run,omitempty"`
	WarmCreate  *Stats `json:"warm_create,omitempty"`
	WarmClaims  int    `json:"warm_claims,omitempty"`
	// RatioWarmFirst is WarmToFirst / CreateToExec at p50.
	RatioWarmFirst float64 `json:"ratio_warm_create_to_first_p50,omitempty"`
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
	if cfg.Warm > 0 {
		if err := codeWarm(ctx, c, cfg, res, log); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// codeWarm measures create→first runCode with a warm pool of cfg.Warm sandboxes on cfg.Env.
func codeWarm(ctx context.Context, c *corral.Client, cfg CodeConfig, res *CodeResult, log *slog.Logger) error {
	env, err := c.Environment(ctx, cfg.Env)
	if err != nil {
		return err
	}
	was := env.Warm
	if _, err := c.UpdateEnvironment(ctx, cfg.Env, corral.EnvironmentPatch{Warm: &cfg.Warm}); err != nil {
		return fmt.Errorf("set warm %d on %s: %w", cfg.Warm, cfg.Env, err)
	}
	defer c.UpdateEnvironment(context.WithoutCancel(ctx), cfg.Env, corral.EnvironmentPatch{Warm: &was})
	log.Info("measuring create → first result from a warm pool", "env", cfg.Env, "warm", cfg.Warm, "creates", cfg.Creates)
	var first, create []time.Duration
	for i := range cfg.Creates {
		// A pool fills off the hot path: wait for a ready sandbox, so the create is a claim.
		deadline := time.Now().Add(5 * time.Minute)
		before := int64(0)
		for {
			e, err := c.Environment(ctx, cfg.Env)
			if err != nil {
				return err
			}
			if e.WarmReady > 0 {
				before = e.WarmHits
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the warm pool of %s has no sandbox ready after 5m", cfg.Env)
			}
			time.Sleep(200 * time.Millisecond)
		}
		start := time.Now()
		sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Environment: cfg.Env, TTL: "10m"})
		if err != nil {
			return fmt.Errorf("warm create %d: %w", i, err)
		}
		created := time.Since(start)
		ex, err := c.RunCode(ctx, sb.ID, corral.CodeRequest{Code: "1+1"}, nil)
		took := time.Since(start)
		c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
		if err != nil || ex.Text() != "2" {
			return fmt.Errorf("first run in %s: %v %+v", sb.ID, err, ex)
		}
		first, create = append(first, took), append(create, created)
		if e, err := c.Environment(ctx, cfg.Env); err == nil && e.WarmHits > before {
			res.WarmClaims++
		}
	}
	wf, wc := summarise(first), summarise(create)
	res.WarmToFirst, res.WarmCreate = &wf, &wc
	res.RatioWarmFirst = ratio(wf.P50, res.CreateToExec.P50)
	return nil
}
