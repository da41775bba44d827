package limits

import (
	"errors"
	"flag"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/doccheck"
	"github.com/corral-dev/corral/internal/errdefs"
)

// TestResolveDefaults: an empty request takes every default of its tier, and every resolved
// field is within the tier's bounds.
func TestResolveDefaults(t *testing.T) {
	p := Default()
	want := Limits{CPUs: 1, MemoryBytes: 1 << 30, Pids: 1024, DiskBytes: 1 << 30, OpenFiles: 4096, OutputBytes: 16 << 20}
	for _, tier := range Tiers {
		got, err := p.Resolve(tier, Limits{})
		if err != nil || got != want {
			t.Errorf("%s: Resolve({}) = %+v, %v; want %+v", tier, got, err, want)
		}
	}
}

// TestResolveBounds: for every tier and every limit, the minimum and the maximum pass, one
// below the minimum, one above the maximum and a negative value are invalid naming the field,
// and a set field is kept as it is.
func TestResolveBounds(t *testing.T) {
	p := Default()
	for _, tier := range Tiers {
		b, ok := p.Bounds(tier)
		if !ok {
			t.Fatalf("no bounds for %s", tier)
		}
		type limit struct {
			field    string
			set      func(l *Limits, v float64)
			get      func(l Limits) float64
			min, max float64
			step     float64
		}
		for _, lim := range []limit{
			{"limits.cpus", func(l *Limits, v float64) { l.CPUs = v }, func(l Limits) float64 { return l.CPUs }, b.Min.CPUs, b.Max.CPUs, 0.001},
			{"limits.memory_bytes", func(l *Limits, v float64) { l.MemoryBytes = int64(v) }, func(l Limits) float64 { return float64(l.MemoryBytes) }, float64(b.Min.MemoryBytes), float64(b.Max.MemoryBytes), 1},
			{"limits.pids", func(l *Limits, v float64) { l.Pids = int64(v) }, func(l Limits) float64 { return float64(l.Pids) }, float64(b.Min.Pids), float64(b.Max.Pids), 1},
			{"limits.disk_bytes", func(l *Limits, v float64) { l.DiskBytes = int64(v) }, func(l Limits) float64 { return float64(l.DiskBytes) }, float64(b.Min.DiskBytes), float64(b.Max.DiskBytes), 1},
			{"limits.open_files", func(l *Limits, v float64) { l.OpenFiles = int64(v) }, func(l Limits) float64 { return float64(l.OpenFiles) }, float64(b.Min.OpenFiles), float64(b.Max.OpenFiles), 1},
			{"limits.output_bytes", func(l *Limits, v float64) { l.OutputBytes = int64(v) }, func(l Limits) float64 { return float64(l.OutputBytes) }, float64(b.Min.OutputBytes), float64(b.Max.OutputBytes), 1},
		} {
			for _, v := range []float64{lim.min, lim.max} {
				var req Limits
				lim.set(&req, v)
				got, err := p.Resolve(tier, req)
				if err != nil || lim.get(got) != v {
					t.Errorf("%s %s=%v: got %v, %v; want it kept", tier, lim.field, v, lim.get(got), err)
				}
			}
			for _, v := range []float64{lim.min - lim.step, lim.max + lim.step, -1} {
				var req Limits
				lim.set(&req, v)
				_, err := p.Resolve(tier, req)
				if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Field(err) != lim.field || !strings.Contains(err.Error(), tier) {
					t.Errorf("%s %s=%v: err = %v; want invalid naming %s and the tier", tier, lim.field, v, err, lim.field)
				}
			}
		}
	}
}

// TestTierMinimums pins the minimums that differ by tier, and the message a user sees.
func TestTierMinimums(t *testing.T) {
	p := Default()
	for _, c := range []struct {
		tier string
		req  Limits
		msg  string
	}{
		{TierMicroVM, Limits{MemoryBytes: 64 << 20}, "limits.memory_bytes: at least 128 MiB on microvm, got 64 MiB"},
		{TierMicroVM, Limits{DiskBytes: 32 << 20}, "limits.disk_bytes: at least 64 MiB on microvm, got 32 MiB"},
		{TierVM, Limits{MemoryBytes: 128 << 20}, "limits.memory_bytes: at least 256 MiB on vm, got 128 MiB"},
		{TierContainer, Limits{MemoryBytes: 8 << 20}, "limits.memory_bytes: at least 16 MiB on container, got 8 MiB"},
		{TierContainer, Limits{CPUs: 0.001}, "limits.cpus: at least 0.01 on container, got 0.001"},
	} {
		_, err := p.Resolve(c.tier, c.req)
		if err == nil || err.Error() != c.msg {
			t.Errorf("%s %+v: err = %v; want %q", c.tier, c.req, err, c.msg)
		}
	}
	// What a container takes, a microvm refuses: the minimums really differ.
	if _, err := p.Resolve(TierContainer, Limits{MemoryBytes: 64 << 20}); err != nil {
		t.Errorf("container with 64 MiB: %v", err)
	}
}

func TestResolveOddCPUs(t *testing.T) {
	p := Default()
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		if _, err := p.Resolve(TierContainer, Limits{CPUs: v}); errdefs.Field(err) != "limits.cpus" {
			t.Errorf("cpus %v: err = %v; want invalid limits.cpus", v, err)
		}
	}
	if _, err := p.Resolve("pc", Limits{}); err == nil || errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("unknown tier: err = %v; want an internal error", err)
	}
}

// TestNodeConfig: the node's disk settings move the disk default and ceiling of every tier; a
// default below a tier's least gives that tier its least.
func TestNodeConfig(t *testing.T) {
	p, err := New(Config{DefaultDiskBytes: 32 << 20, MaxDiskBytes: 128 << 30, DefaultTTL: time.Minute, MaxTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for tier, want := range map[string]int64{TierContainer: 32 << 20, TierFncall: 32 << 20, TierMicroVM: 64 << 20, TierVM: 32 << 20} {
		got, err := p.Resolve(tier, Limits{})
		if err != nil || got.DiskBytes != want {
			t.Errorf("%s: default disk %d, %v; want %d", tier, got.DiskBytes, err, want)
		}
		if _, err := p.Resolve(tier, Limits{DiskBytes: 100 << 30}); err != nil {
			t.Errorf("%s: 100 GiB under a 128 GiB ceiling: %v", tier, err)
		}
	}
	if p.DefaultTTL() != time.Minute || p.MaxTTL() != time.Hour {
		t.Errorf("TTLs %s, %s; want 1m, 1h", p.DefaultTTL(), p.MaxTTL())
	}
	for _, c := range []struct {
		cfg   Config
		field string
	}{
		{Config{DefaultDiskBytes: 1 << 20}, "sandbox-disk"},
		{Config{DefaultDiskBytes: 2 << 30, MaxDiskBytes: 1 << 30}, "sandbox-disk"},
		{Config{MaxDiskBytes: 2 << 50}, "max-sandbox-disk"},
		{Config{DefaultTTL: 2 * time.Hour, MaxTTL: time.Hour}, "default-ttl"},
	} {
		if _, err := New(c.cfg); errdefs.Field(err) != c.field {
			t.Errorf("New(%+v): err = %v; want invalid %s", c.cfg, err, c.field)
		}
	}
}

func TestTTL(t *testing.T) {
	p := Default()
	for _, c := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"30m", 30 * time.Minute, true},
		{"1s", time.Second, true},
		{"168h", 168 * time.Hour, true},
		{"999ms", 0, false},
		{"169h", 0, false},
		{"soon", 0, false},
		{"-1h", 0, false},
	} {
		got, err := p.TTL("ttl", c.in)
		if c.ok && (err != nil || got != c.want) || !c.ok && errdefs.Field(err) != "ttl" {
			t.Errorf("TTL(%q) = %s, %v; want %s (ok %v)", c.in, got, err, c.want, c.ok)
		}
	}
}

func TestSize(t *testing.T) {
	for n, want := range map[int64]string{512: "512 B", 4 << 10: "4 KiB", 128 << 20: "128 MiB", 1536 << 20: "1.5 GiB", -1: "-1 B", 1 << 62: "4 EiB"} {
		if got := Size(n); got != want {
			t.Errorf("Size(%d) = %q; want %q", n, got, want)
		}
	}
}

// TestDocumented: docs/ARCHITECTURE.md shows the table this package holds (go test -run
// TestDocumented -update rewrites it).
func TestDocumented(t *testing.T) {
	const path = "../../docs/ARCHITECTURE.md"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- limits table: begin (internal/limits.Table) -->\n", "<!-- limits table: end -->"
	doc := string(b)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the markers %q and %q", path, begin, end)
	}
	want := Table()
	if got := doc[i+len(begin) : j]; got != want {
		if *update {
			if err := os.WriteFile(path, []byte(doc[:i+len(begin)]+want+doc[j:]), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("%s shows another limits table than internal/limits holds (go test ./internal/limits -run TestDocumented -update):\n%s", path, want)
	}
}

var update = flag.Bool("update", false, "rewrite the documented limits table")

func BenchmarkResolve(b *testing.B) {
	p := Default()
	req := Limits{MemoryBytes: 512 << 20, CPUs: 2}
	for b.Loop() {
		if _, err := p.Resolve(TierMicroVM, req); err != nil {
			b.Fatal(err)
		}
	}
}

func TestDocComments(t *testing.T) { doccheck.Exported(t, ".") }
