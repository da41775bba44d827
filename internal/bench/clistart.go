package bench

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"time"
)

// CLIStartConfig configures the CLI start benchmark.
type CLIStartConfig struct {
	Corral string // the corral binary measured
	Runc   string // the baseline: runc, whose --version is timed the same way
	Rounds int    // samples of each command line
}

// CLIStartResult is the wall time of whole processes, from fork to exit, sampled in turn so
// the host's load falls on all of them alike.
type CLIStartResult struct {
	Date   string `json:"date"`
	Corral string `json:"corral"`
	Runc   string `json:"runc"`

	Version         Stats   `json:"corral_version"`
	Help            Stats   `json:"corral_help"`
	Get404          Stats   `json:"corral_get_404"`
	RuncVersion     Stats   `json:"baseline_runc_version"`
	VersionRatioP50 float64 `json:"version_ratio_p50"`
	GetRatioP50     float64 `json:"get_404_ratio_p50"`
	// CPU is each command's CPU time (user + system), which a loaded host does not inflate as
	// it does wall time.
	CPU          map[string]Stats `json:"cpu_ms"`
	Get404Stderr string           `json:"get_404_stderr"`
}

// CLIStart times `corral --version`, `corral --help` and `corral get` answered 404 by a stub
// server on loopback (the whole client path), against `runc --version`. Harnesses written in shell start corral per step, so its start is on
// their path.
func CLIStart(ctx context.Context, cfg CLIStartConfig, log *slog.Logger) (*CLIStartResult, error) {
	if cfg.Rounds <= 0 {
		cfg.Rounds = 200
	}
	// A server that answers every call at once with the API's not-found error, so `corral get`
	// measures the client (start, request, error message), not a server.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"code":"not_found","message":"sandbox sb-none not found"}`)
	}))
	defer srv.Close()
	env := append(os.Environ(), "CORRAL_URL="+srv.URL, "CORRAL_TOKEN=x")
	cmds := []struct {
		args    []string
		wantErr bool
		d, cpu  []time.Duration
	}{
		{args: []string{cfg.Runc, "--version"}},
		{args: []string{cfg.Corral, "--version"}},
		{args: []string{cfg.Corral, "--help"}},
		{args: []string{cfg.Corral, "get", "sb-none"}, wantErr: true},
	}
	res := &CLIStartResult{Date: time.Now().UTC().Format(time.RFC3339), Corral: cfg.Corral, Runc: cfg.Runc}
	for i := range cfg.Rounds + 5 {
		for j := range cmds {
			c := &cmds[j]
			cmd := exec.CommandContext(ctx, c.args[0], c.args[1:]...)
			cmd.Env = env
			var stderr limitedBuffer
			cmd.Stderr = &stderr
			start := time.Now()
			err := cmd.Run()
			d := time.Since(start)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if (err != nil) != c.wantErr {
				return nil, fmt.Errorf("run %v: %v: %s", c.args, err, stderr.String())
			}
			if c.wantErr {
				res.Get404Stderr = stderr.String()
			}
			if i >= 5 { // the first rounds warm the page cache
				c.d = append(c.d, d)
				c.cpu = append(c.cpu, cmd.ProcessState.UserTime()+cmd.ProcessState.SystemTime())
			}
		}
	}
	res.RuncVersion = summarise(cmds[0].d)
	res.Version = summarise(cmds[1].d)
	res.Help = summarise(cmds[2].d)
	res.Get404 = summarise(cmds[3].d)
	res.CPU = map[string]Stats{"runc --version": summarise(cmds[0].cpu), "corral --version": summarise(cmds[1].cpu),
		"corral --help": summarise(cmds[2].cpu), "corral get": summarise(cmds[3].cpu)}
	res.VersionRatioP50 = ratio(res.Version.P50, res.RuncVersion.P50)
	res.GetRatioP50 = ratio(res.Get404.P50, res.RuncVersion.P50)
	log.Info("cli start", "version_p50_ms", res.Version.P50, "get_p50_ms", res.Get404.P50, "runc_p50_ms", res.RuncVersion.P50)
	return res, nil
}

// limitedBuffer keeps the first 4 KiB written to it.
type limitedBuffer struct{ b []byte }

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if n := 4096 - len(l.b); n > 0 {
		l.b = append(l.b, p[:min(n, len(p))]...)
	}
	return len(p), nil
}

func (l *limitedBuffer) String() string { return string(l.b) }
