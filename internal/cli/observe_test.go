package cli

import (
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
	"github.com/corral-dev/corral/sdk/go/corraltest"
)

func TestMetricsCmd(t *testing.T) {
	srv := corraltest.NewServer(t)
	sb, err := srv.Client().CreateSandbox(t.Context(), corral.CreateRequest{Base: corraltest.DefaultBase})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(-time.Minute).UTC()
	srv.SetMetrics(sb.ID, []corral.MetricSample{
		{At: at, CPUPercent: 12.5, MemoryBytes: 3 << 20, MemoryPeakBytes: 4 << 20, DiskBytes: 1 << 20, Pids: 3},
		{At: at.Add(5 * time.Second), CPUPercent: 99, MemoryBytes: 5 << 20, MemoryPeakBytes: 5 << 20, Pids: 4},
	})
	got := mustCLI(t, srv, nil, "metrics", sb.ID)
	if !strings.Contains(got.stdout, "CPU%") || !strings.Contains(got.stdout, "12.5") || !strings.Contains(got.stdout, "99.0") || !strings.Contains(got.stdout, "5MiB") {
		t.Errorf("corral metrics:\n%s", got.stdout)
	}
	var m corral.Metrics
	decode(t, mustCLI(t, srv, nil, "metrics", sb.ID, "-o", "json"), &m)
	if len(m.Samples) != 2 || m.Samples[1].Pids != 4 {
		t.Errorf("corral metrics -o json: %+v", m)
	}
	usageRefused(t, srv, "--since", "metrics", sb.ID, "--since", "soon")
	usageRefused(t, srv, "a sandbox ID", "metrics")
}

func TestSparkline(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want string
	}{
		{nil, ""},
		{[]float64{0, 0}, "▁▁"},
		{[]float64{0, 50, 100}, "▁▅█"},
		{[]float64{7}, "█"},
	} {
		if got := sparkline(c.in); got != c.want {
			t.Errorf("sparkline(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestParseAge(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"10m", 10 * time.Minute, true},
		{"7d", 7 * 24 * time.Hour, true},
		{"-1h", 0, false},
		{"xd", 0, false},
		{"soon", 0, false},
	} {
		got, err := parseAge(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("parseAge(%q) = %v, %v", c.in, got, err)
		}
	}
}
