package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	corral "github.com/corral-dev/corral/sdk/go"
)

// E2BConfig sizes `corral bench e2b`: the real e2b SDK through Corral's E2B gateway against
// Corral's own API for the same operations, in one run.
type E2BConfig struct {
	Base     string // the template: a layer NAME:VERSION (default base:default)
	E2BURL   string // the gateway (corral up --e2b-listen), http://HOST:PORT
	SDKDir   string // where node_modules/e2b is (scripts/e2b-sdk.sh prints it)
	Script   string // test/e2b/bench.mjs
	Creates  int    // sandboxes created each way (default 10)
	Runs     int    // commands run('true') each way (default 100)
	NodePath string // node (default: on PATH)
	APIKey   string // the Corral token the SDK presents (the client's)
}

// E2BResult is what `corral bench e2b` measured.
type E2BResult struct {
	Date   string  `json:"date"`
	Host   string  `json:"host"`
	Base   string  `json:"base"`
	SDK    E2BSide `json:"e2b_sdk"`
	Native E2BSide `json:"corral_api"`
	// Ratios are the SDK's p50 over Corral's own.
	CreateRatioP50 float64 `json:"create_to_first_run_ratio_p50"`
	RunRatioP50    float64 `json:"run_true_ratio_p50"`
}

// E2BSide is one way of doing the operations.
type E2BSide struct {
	CreateToFirstRun Stats `json:"create_to_first_run"`
	RunTrue          Stats `json:"run_true"`
}

// E2B runs the benchmark: the SDK side in node (the script), the native side here with c.
func E2B(ctx context.Context, c *corral.Client, cfg E2BConfig, log *slog.Logger) (*E2BResult, error) {
	if cfg.Base == "" {
		cfg.Base = "base:default"
	}
	if cfg.Creates == 0 {
		cfg.Creates = 10
	}
	if cfg.Runs == 0 {
		cfg.Runs = 100
	}
	if cfg.NodePath == "" {
		cfg.NodePath = "node"
	}
	if cfg.E2BURL == "" || cfg.SDKDir == "" || cfg.Script == "" {
		return nil, errdefs.Invalid("e2b", "--e2b-url, --sdk-dir and --script are required")
	}
	host, _ := os.Hostname()
	res := &E2BResult{Date: time.Now().UTC().Format(time.RFC3339), Host: host, Base: cfg.Base}

	log.Info("measuring Corral's own API", "creates", cfg.Creates, "runs", cfg.Runs)
	var create, run []time.Duration
	for i := range cfg.Creates {
		t0 := time.Now()
		sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: cfg.Base, Labels: map[string]string{"bench": "e2b-native"}})
		if err != nil {
			return nil, err
		}
		if _, _, _, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}}); err != nil {
			return nil, err
		}
		create = append(create, time.Since(t0))
		if i == 0 {
			for range cfg.Runs {
				t1 := time.Now()
				if _, _, _, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}}); err != nil {
					return nil, err
				}
				run = append(run, time.Since(t1))
			}
		}
		if _, err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			return nil, err
		}
	}
	res.Native = E2BSide{CreateToFirstRun: summarise(create), RunTrue: summarise(run)}

	log.Info("measuring the e2b SDK through the gateway", "url", cfg.E2BURL)
	dir, err := os.MkdirTemp("", "corral-bench-e2b-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	src, err := os.ReadFile(cfg.Script)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "bench.mjs"), src, 0o644); err != nil {
		return nil, err
	}
	if err := os.Symlink(filepath.Join(cfg.SDKDir, "node_modules"), filepath.Join(dir, "node_modules")); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, cfg.NodePath, "bench.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+cfg.E2BURL, "E2B_SANDBOX_URL="+cfg.E2BURL, "E2B_API_KEY="+cfg.APIKey,
		"E2B_TEMPLATE="+cfg.Base, "BENCH_CREATES="+strconv.Itoa(cfg.Creates), "BENCH_RUNS="+strconv.Itoa(cfg.Runs))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("the e2b SDK side: %v: %s", err, stderr.String())
	}
	var sdk struct {
		Create []float64 `json:"create_to_first_run_ms"`
		Run    []float64 `json:"run_true_ms"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &sdk); err != nil {
		return nil, fmt.Errorf("the e2b SDK side printed %q: %w", stdout.String(), err)
	}
	res.SDK = E2BSide{CreateToFirstRun: summarise(millis(sdk.Create)), RunTrue: summarise(millis(sdk.Run))}
	res.CreateRatioP50 = res.SDK.CreateToFirstRun.P50 / res.Native.CreateToFirstRun.P50
	res.RunRatioP50 = res.SDK.RunTrue.P50 / res.Native.RunTrue.P50
	return res, nil
}

func millis(ms []float64) []time.Duration {
	out := make([]time.Duration, len(ms))
	for i, m := range ms {
		out[i] = time.Duration(m * float64(time.Millisecond))
	}
	return out
}
