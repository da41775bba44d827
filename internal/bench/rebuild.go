package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"time"

	"github.com/corral-dev/corral/internal/layers"
	corral "github.com/corral-dev/corral/sdk/go"
)

// RebuildConfig sizes the toolkit-change benchmark.
type RebuildConfig struct {
	Base       string // the base layer NAME:VERSION, published from Rootfs
	Rootfs     string // the base's directory, for the fused images
	Workspaces int    // workspaces that use the toolkit
	WSFiles    int    // 1 KiB files per workspace
	TKFiles    int    // 1 KiB files in the toolkit
}

// RebuildResult compares publishing a new toolkit version to N environments, the Corral way (one
// layer, N environment updates) and the fused way (N flattened images rebuilt and imported).
type RebuildResult struct {
	Date           string  `json:"date"`
	Workspaces     int     `json:"workspaces"`
	CorralMs       float64 `json:"corral_ms"`
	FusedMs        float64 `json:"fused_ms"`
	Ratio          float64 `json:"fused_over_corral"`
	CorralBytes    int64   `json:"corral_new_layer_bytes"`
	FusedBytes     int64   `json:"fused_new_layer_bytes"`
	CorralPerWSMs  float64 `json:"corral_ms_per_workspace"`
	FusedPerWSMs   float64 `json:"fused_ms_per_workspace"`
	CorralLayers   int     `json:"corral_layers_published"`
	FusedLayers    int     `json:"fused_layers_published"`
	EnvUpdatesMade int     `json:"environment_updates"`
}

// Rebuild sets up cfg.Workspaces environments (base + workspace i + toolkit v1), then changes the
// toolkit both ways and times them.
func Rebuild(ctx context.Context, c *corral.Client, cfg RebuildConfig, log *slog.Logger) (*RebuildResult, error) {
	res := &RebuildResult{Date: time.Now().UTC().Format(time.RFC3339), Workspaces: cfg.Workspaces}
	run := fmt.Sprintf("r%d", time.Now().UnixNano())
	wsTar := func(i int) []byte { return filesTar(fmt.Sprintf("workspace/ws%03d", i), cfg.WSFiles) }
	log.Info("publishing workspaces and toolkit v1", "workspaces", cfg.Workspaces)
	if _, err := c.ImportLayer(ctx, "bench-tool", run+"-v1", corral.KindToolkit, bytes.NewReader(filesTar("opt/tool-v1", cfg.TKFiles))); err != nil {
		return nil, err
	}
	// The environments name the toolkit by a movable tag.
	cur := run + "-current"
	if _, err := c.TagLayer(ctx, "bench-tool", cur, run+"-v1"); err != nil {
		return nil, err
	}
	for i := range cfg.Workspaces {
		ws := fmt.Sprintf("bench-ws%03d", i)
		if _, err := c.ImportLayer(ctx, ws, run, corral.KindWorkspace, bytes.NewReader(wsTar(i))); err != nil {
			return nil, err
		}
		if _, err := c.SaveEnvironment(ctx, corral.Environment{Name: fmt.Sprintf("bench-%s-%03d", run, i), Base: cfg.Base,
			Workspace: ws + ":" + run, Toolkits: []string{"bench-tool:" + cur}}); err != nil {
			return nil, err
		}
	}

	log.Info("toolkit v2, the Corral way: one layer, and the environments' tag moved to it")
	start := time.Now()
	l, err := c.ImportLayer(ctx, "bench-tool", run+"-v2", corral.KindToolkit, bytes.NewReader(filesTar("opt/tool-v2", cfg.TKFiles)))
	if err != nil {
		return nil, err
	}
	if _, err := c.TagLayer(ctx, "bench-tool", cur, run+"-v2"); err != nil {
		return nil, err
	}
	res.CorralMs = ms(time.Since(start))
	res.CorralBytes, res.CorralLayers, res.EnvUpdatesMade = l.Size, 1, 0
	// Every environment now makes sandboxes with v2: check one.
	sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Environment: fmt.Sprintf("bench-%s-%03d", run, cfg.Workspaces-1)})
	if err != nil {
		return nil, err
	}
	c.DeleteSandbox(ctx, sb.ID)
	if len(sb.Toolkits) != 1 || sb.Toolkits[0] != "bench-tool:"+run+"-v2" {
		return nil, fmt.Errorf("an environment still makes sandboxes with %v", sb.Toolkits)
	}

	log.Info("toolkit v2, the fused way: every workspace's image flattened again and imported")
	start = time.Now()
	tk := filesTar("opt/tool-v2", cfg.TKFiles)
	for i := range cfg.Workspaces {
		dir, err := os.MkdirTemp("", "crl-fused-")
		if err != nil {
			return nil, err
		}
		if out, err := exec.CommandContext(ctx, "cp", "-a", cfg.Rootfs+"/.", dir).CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("copy the base: %v: %s", err, out)
		}
		for _, t := range [][]byte{wsTar(i), tk} {
			if err := untar(dir, t); err != nil {
				os.RemoveAll(dir)
				return nil, err
			}
		}
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(layers.WriteTar(ctx, dir, pw)) }()
		fl, err := c.ImportLayer(ctx, fmt.Sprintf("bench-fused%03d", i), run+"-v2", corral.KindBase, pr)
		pr.Close()
		os.RemoveAll(dir)
		if err != nil {
			return nil, err
		}
		res.FusedBytes += fl.Size
	}
	res.FusedMs = ms(time.Since(start))
	res.FusedLayers = cfg.Workspaces
	res.Ratio = res.FusedMs / res.CorralMs
	res.CorralPerWSMs, res.FusedPerWSMs = res.CorralMs/float64(cfg.Workspaces), res.FusedMs/float64(cfg.Workspaces)
	return res, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// untar writes the regular files and directories of a tar made by filesTar under dir.
func untar(dir string, b []byte) error {
	cmd := exec.Command("tar", "-C", dir, "-xf", "-")
	cmd.Stdin = bytes.NewReader(b)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("untar: %v: %s", err, out)
	}
	return nil
}
