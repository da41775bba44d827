package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/layers"
	"github.com/corral-dev/corral/internal/runtime/backends"
	corral "github.com/corral-dev/corral/sdk/go"
)

// BuildConfig sizes the Dockerfile build benchmark.
type BuildConfig struct {
	Base   string // the base layer NAME:VERSION, published from Rootfs
	Rootfs string // the base's directory, imported into podman as the same base
	Rounds int    // cold builds and last-step rebuilds per builder
	Files  int    // 4 KiB files in the context the COPY step copies
	Podman string // the podman binary ("" finds it on PATH; "none" skips the baseline)
	// PodmanRuntime is the OCI runtime podman runs RUN steps with: Corral's runc by default (the
	// same runtime on both sides; Debian's crun refuses this host's hybrid cgroups).
	PodmanRuntime string
}

// BuildResult compares `corral env build` with `podman build` of the same 5-step Dockerfile:
// cold (every step runs), and after a change of the last step (the rest from the cache).
type BuildResult struct {
	Date            string  `json:"date"`
	Rounds          int     `json:"rounds"`
	Dockerfile      string  `json:"dockerfile"`
	CorralCold      Stats   `json:"corral_cold"`
	CorralLast      Stats   `json:"corral_last_step_changed"`
	PodmanCold      Stats   `json:"podman_cold"`
	PodmanLast      Stats   `json:"podman_last_step_changed"`
	ColdRatioP50    float64 `json:"cold_corral_over_podman_p50"`
	LastRatioP50    float64 `json:"last_step_corral_over_podman_p50"`
	PodmanVersion   string  `json:"podman_version"`
	PodmanStorage   string  `json:"podman_storage_driver"`
	PodmanRuntime   string  `json:"podman_runtime"`
	CorralCachedMin int     `json:"corral_cached_steps_min_on_rebuild"`
}

// buildBenchDockerfile is the measured Dockerfile: FROM, then four steps, two of which make
// layers by running commands and one by copying the context. SALT makes every cold round cold
// for both builders; LAST changes the last step only.
const buildBenchDockerfile = `FROM %s
ENV SALT=%s
COPY data/ /opt/data/
RUN i=0; while [ $i -lt 200 ]; do echo $i > /opt/data/gen$i; i=$((i+1)); done; cat /opt/data/* | wc -c > /opt/size
RUN echo %s > /opt/last
`

// Build measures cfg.Rounds cold builds and last-step rebuilds with Corral and with podman,
// alternating.
func Build(ctx context.Context, c *corral.Client, cfg BuildConfig, log *slog.Logger) (*BuildResult, error) {
	if cfg.Rounds <= 0 {
		cfg.Rounds = 5
	}
	if cfg.Files <= 0 {
		cfg.Files = 100
	}
	res := &BuildResult{Date: time.Now().UTC().Format(time.RFC3339), Rounds: cfg.Rounds, CorralCachedMin: -1}
	work, err := os.MkdirTemp("", "corral-bench-build-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	ctxDir := filepath.Join(work, "context")
	if err := os.MkdirAll(filepath.Join(ctxDir, "data"), 0o755); err != nil {
		return nil, err
	}
	chunk := bytes.Repeat([]byte("corral!\n"), 512)
	for i := range cfg.Files {
		if err := os.WriteFile(filepath.Join(ctxDir, "data", fmt.Sprintf("f%04d", i)), chunk, 0o644); err != nil {
			return nil, err
		}
	}
	podman := cfg.Podman
	if podman == "" {
		if podman, err = exec.LookPath("podman"); err != nil {
			return nil, fmt.Errorf("podman is needed for the baseline (Debian's podman; --podman none skips it): %w", err)
		}
	}
	const podmanBase = "localhost/corral-bench-build-base:latest"
	if cfg.PodmanRuntime == "" {
		cfg.PodmanRuntime = backends.DefaultRunc
	}
	// A store of its own (overlay, on the work directory's filesystem): the host's podman
	// images are never touched.
	store := filepath.Join(work, "podman")
	pod := func(args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, podman, append([]string{"--root", filepath.Join(store, "root"), "--runroot", filepath.Join(store, "run"),
			"--storage-driver", "overlay", "--events-backend", "none", "--runtime", cfg.PodmanRuntime, "--cgroup-manager", "cgroupfs"}, args...)...)
	}
	if podman != "none" {
		if out, err := pod("version", "--format", "{{.Client.Version}}").Output(); err == nil {
			res.PodmanVersion = strings.TrimSpace(string(out))
		}
		if out, err := pod("info", "--format", "{{.Store.GraphDriverName}}").Output(); err == nil {
			res.PodmanStorage = strings.TrimSpace(string(out))
		}
		// The same base for podman: the rootfs imported as an image (not timed).
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(layers.WriteTar(ctx, cfg.Rootfs, pw)) }()
		imp := pod("import", "-", podmanBase)
		imp.Stdin = pr
		if out, err := imp.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("podman import the base: %v: %s", err, out)
		}
		// Before the work directory goes: the store's mounts and layers.
		defer func() {
			c := pod("system", "reset", "-f")
			c.Stdin = strings.NewReader("y\n")
			c.Run()
		}()
	}
	res.PodmanRuntime = cfg.PodmanRuntime
	run := fmt.Sprintf("%d", time.Now().UnixNano())
	var cc, cl, pc, pl []time.Duration
	for r := range cfg.Rounds {
		salt := fmt.Sprintf("%s-%d", run, r)
		for _, last := range []string{"one", "two"} {
			text := fmt.Sprintf(buildBenchDockerfile, cfg.Base, salt, last)
			res.Dockerfile = fmt.Sprintf(buildBenchDockerfile, "BASE", "SALT", "LAST")
			d, cached, err := corralBuild(ctx, c, "bench-build", text, ctxDir)
			if err != nil {
				return nil, fmt.Errorf("corral build, round %d: %w", r, err)
			}
			if last == "one" {
				cc = append(cc, d)
			} else {
				cl = append(cl, d)
				if res.CorralCachedMin < 0 || cached < res.CorralCachedMin {
					res.CorralCachedMin = cached
				}
			}
			if podman == "none" {
				continue
			}
			df := filepath.Join(work, "Dockerfile")
			if err := os.WriteFile(df, []byte(fmt.Sprintf(buildBenchDockerfile, podmanBase, salt, last)), 0o644); err != nil {
				return nil, err
			}
			start := time.Now()
			cmd := pod("build", "-q", "--pull=never", "-t", "corral-bench-build:"+last, "-f", df, ctxDir)
			if out, err := cmd.CombinedOutput(); err != nil {
				return nil, fmt.Errorf("podman build, round %d: %v: %s", r, err, out)
			}
			if last == "one" {
				pc = append(pc, time.Since(start))
			} else {
				pl = append(pl, time.Since(start))
			}
		}
		log.Info("build round", "round", r+1, "corral_cold", cc[len(cc)-1], "corral_last", cl[len(cl)-1])
	}
	res.CorralCold, res.CorralLast = summarise(cc), summarise(cl)
	res.PodmanCold, res.PodmanLast = summarise(pc), summarise(pl)
	if res.PodmanCold.P50 > 0 {
		res.ColdRatioP50 = res.CorralCold.P50 / res.PodmanCold.P50
		res.LastRatioP50 = res.CorralLast.P50 / res.PodmanLast.P50
	}
	return res, nil
}

// corralBuild runs one build to its end and returns its wall time (request to the end event)
// and how many steps it found cached.
func corralBuild(ctx context.Context, c *corral.Client, name, dockerfile, ctxDir string) (time.Duration, int, error) {
	start := time.Now()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(layers.WriteTar(ctx, ctxDir, pw)) }()
	b, err := c.StartBuild(ctx, corral.BuildRequest{Name: name, Dockerfile: dockerfile}, pr)
	pr.Close()
	if err != nil {
		return 0, 0, err
	}
	logs, err := c.BuildLogs(ctx, b.ID, true)
	if err != nil {
		return 0, 0, err
	}
	defer logs.Close()
	for {
		ev, err := logs.Next()
		if err != nil {
			return 0, 0, err
		}
		if ev.Type != "end" {
			continue
		}
		took := time.Since(start)
		if ev.Build.State != corral.BuildSucceeded {
			return 0, 0, errors.New(ev.Build.Error)
		}
		cached := 0
		for _, s := range ev.Build.Steps {
			if s.State == "cached" {
				cached++
			}
		}
		return took, cached, nil
	}
}
