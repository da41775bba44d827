package bench

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/placement"
)

// TestPlacement runs the placement benchmark on tiny simulated clusters: no server, no root.
func TestPlacement(t *testing.T) {
	cfg := PlacementConfig{Nodes: []int{10, 100}, Fill: 0.5, ReportEvery: 20, Seed: 3}
	res, err := Placement(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("Placement: %v", err)
	}
	if got, want := len(res.Runs), 2*6; got != want {
		t.Fatalf("runs: got %d, want %d", got, want)
	}
	imb := map[string]float64{}
	for _, r := range res.Runs {
		if r.MeanLoad < cfg.Fill || r.MeanLoad > cfg.Fill+0.1 {
			t.Errorf("%d nodes, k=%s, %s: mean load %.3f, want just over %.2f", r.Nodes, r.K, r.Variant, r.MeanLoad, cfg.Fill)
		}
		if r.Placements == 0 || r.Latency.N != r.Placements+r.Failures || r.Latency.P50 <= 0 {
			t.Errorf("%d nodes, k=%s, %s: %d placed, %d failed, latency %+v", r.Nodes, r.K, r.Variant, r.Placements, r.Failures, r.Latency)
		}
		if r.MaxLoad > 1+1e-9 || r.Imbalance < 1 {
			t.Errorf("%d nodes, k=%s, %s: max load %.3f, imbalance %.3f", r.Nodes, r.K, r.Variant, r.MaxLoad, r.Imbalance)
		}
		if r.Nodes == 100 && r.Variant == "one replica" {
			imb[r.K] = r.Imbalance
		}
	}
	if imb["2"] >= imb["1"] {
		t.Errorf("100 nodes: k=2 imbalance %.3f, want below k=1's %.3f", imb["2"], imb["1"])
	}
}

// TestPlacementHerd checks the simulated edges' admission: with reports lagging 1,000 placements
// and no in-flight accounting, least loaded of all herds onto the emptiest nodes and the edges
// refuse the excess, so no node ends over full.
func TestPlacementHerd(t *testing.T) {
	cfg := PlacementConfig{Nodes: []int{50}, ReportEvery: 1000}.withDefaults()
	r, err := simulatePlacement(context.Background(), cfg, 50, placement.KAll, 1, time.Nanosecond)
	if err != nil {
		t.Fatal(err)
	}
	if r.Refusals == 0 || r.MaxLoad > 1+1e-9 {
		t.Errorf("got %d refusals and max load %.3f; want refusals and no node over full", r.Refusals, r.MaxLoad)
	}
	ok, err := simulatePlacement(context.Background(), cfg, 50, placement.KAll, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ok.Refusals != 0 || ok.Imbalance >= r.Imbalance {
		t.Errorf("with in-flight accounting: %d refusals, imbalance %.3f; want none and below %.3f", ok.Refusals, ok.Imbalance, r.Imbalance)
	}
}

// TestPlacementConfigValidate checks that impossible settings are refused.
func TestPlacementConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  PlacementConfig
		ok   bool
	}{
		{"defaults", PlacementConfig{}, true},
		{"no nodes", PlacementConfig{Nodes: []int{0}}, false},
		{"overfull", PlacementConfig{Fill: 1}, false},
		{"negative report interval", PlacementConfig{ReportEvery: -1}, false},
	} {
		err := tc.cfg.withDefaults().Validate()
		if got := err == nil; got != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}
