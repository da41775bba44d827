package bench

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"
)

// TestIAM runs the identity benchmark at a tiny size: it needs no server and no root.
func TestIAM(t *testing.T) {
	cfg := IAMConfig{
		Dir: t.TempDir(), Projects: 200, Principals: 50, Grants: 1000, Sandboxes: 100, History: 200,
		N: 20, Concurrency: 4, Duration: 500 * time.Millisecond,
	}
	res, err := IAM(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("IAM: %v", err)
	}
	if got, want := len(res.Depths), 2; got != want {
		t.Fatalf("depths: got %d, want %d", got, want)
	}
	for _, d := range res.Depths {
		if d.Baseline.N != cfg.N || d.With.N != cfg.N || d.Added.N != cfg.N {
			t.Errorf("depth %d: got %d/%d/%d samples, want %d", d.Depth, d.Baseline.N, d.With.N, d.Added.N, cfg.N)
		}
		if d.Limited != d.Depth+1 {
			t.Errorf("depth %d: got %d limited levels, want %d", d.Depth, d.Limited, d.Depth+1)
		}
		if d.With.P50 <= 0 || d.Baseline.P50 <= 0 {
			t.Errorf("depth %d: empty latencies: with %+v, baseline %+v", d.Depth, d.With, d.Baseline)
		}
	}
	tp := res.Throughput
	if tp.ChecksOn <= 0 || tp.ChecksOff <= 0 || tp.Full <= 0 {
		t.Errorf("throughput: got on %.1f/s, off %.1f/s, full %.1f/s; want all positive", tp.ChecksOn, tp.ChecksOff, tp.Full)
	}
	if got, want := len(res.Sensitivity), 5; got != want {
		t.Errorf("sensitivity: got %d variants, want %d", got, want)
	}
	if res.Projects != cfg.Projects || res.Grants != cfg.Grants {
		t.Errorf("populated %d projects and %d grants, want %d and %d", res.Projects, res.Grants, cfg.Projects, cfg.Grants)
	}
}

// TestIAMConfigValidate checks that sizes that cannot be populated are refused.
func TestIAMConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  IAMConfig
		ok   bool
	}{
		{"defaults", IAMConfig{}, true},
		{"too few projects", IAMConfig{Projects: 10}, false},
		{"more grants per principal than projects", IAMConfig{Projects: 20, Principals: 1, Grants: 100}, false},
		{"fewer grants than principals", IAMConfig{Principals: 10, Grants: 5}, false},
	} {
		err := tc.cfg.withDefaults().Validate()
		if got := err == nil; got != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}
