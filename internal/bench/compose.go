package bench

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// ComposeConfig sizes a composition benchmark run.
type ComposeConfig struct {
	Base   string // the base layer NAME:VERSION
	Rounds int    // create→first exec samples each way
	Files  int    // files in each of the workspace and the 3 toolkits
}

// ComposeResult compares creation from a base alone with base + workspace + 3 toolkits.
type ComposeResult struct {
	Date     string  `json:"date"`
	BaseOnly Stats   `json:"tti_base_only"`
	Composed Stats   `json:"tti_base_workspace_3_toolkits"`
	Ratio    float64 `json:"ratio_p50"`
}

// Compose publishes a workspace and three toolkits (cfg.Files small files each, under their own
// directories) and measures create→first exec with and without them, alternating.
func Compose(ctx context.Context, c *corral.Client, cfg ComposeConfig, log *slog.Logger) (*ComposeResult, error) {
	res := &ComposeResult{Date: time.Now().UTC().Format(time.RFC3339)}
	version := fmt.Sprintf("b%d", time.Now().UnixNano())
	layers := []struct{ name, kind, dir string }{
		{"bench-ws", corral.KindWorkspace, "workspace"},
		{"bench-tk1", corral.KindToolkit, "opt/tk1"}, {"bench-tk2", corral.KindToolkit, "opt/tk2"}, {"bench-tk3", corral.KindToolkit, "opt/tk3"},
	}
	for _, l := range layers {
		if _, err := c.ImportLayer(ctx, l.name, version, l.kind, bytes.NewReader(filesTar(l.dir, cfg.Files))); err != nil {
			return nil, fmt.Errorf("publish %s: %w", l.name, err)
		}
	}
	composed := corral.CreateRequest{Base: cfg.Base, Workspace: "bench-ws:" + version,
		Toolkits: []string{"bench-tk1:" + version, "bench-tk2:" + version, "bench-tk3:" + version}}
	log.Info("measuring creation: base alone vs base + workspace + 3 toolkits", "rounds", cfg.Rounds)
	var base, comp []time.Duration
	for range cfg.Rounds {
		for i, req := range []corral.CreateRequest{{Base: cfg.Base}, composed} {
			start := time.Now()
			sb, err := c.CreateSandbox(ctx, req)
			if err != nil {
				return nil, err
			}
			if _, _, _, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}}); err != nil {
				return nil, err
			}
			d := time.Since(start)
			c.DeleteSandbox(ctx, sb.ID)
			if i == 0 {
				base = append(base, d)
			} else {
				comp = append(comp, d)
			}
		}
	}
	res.BaseOnly, res.Composed = summarise(base), summarise(comp)
	res.Ratio = res.Composed.P50 / res.BaseOnly.P50
	return res, nil
}

// filesTar is a tar of n 1 KiB files under dir.
func filesTar(dir string, n int) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755})
	body := bytes.Repeat([]byte("x"), 1024)
	for i := range n {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("%s/f%05d", dir, i), Mode: 0o644, Size: int64(len(body))})
		tw.Write(body)
	}
	tw.Close()
	return buf.Bytes()
}
