package bench

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestLazyConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     LazyConfig
		wantErr bool
	}{
		{"defaults", LazyConfig{Corral: "c", Rootfs: "r", CPUs: 0.01}, false},
		{"no binary", LazyConfig{Rootfs: "r"}, true},
		{"no rootfs", LazyConfig{Corral: "c"}, true},
		{"tiny image", LazyConfig{Corral: "c", Rootfs: "r", ImageMiB: 8}, true},
		{"percents not ascending", LazyConfig{Corral: "c", Rootfs: "r", CPUs: 0.01, Percents: []int{30, 5}}, true},
		{"percent above 100", LazyConfig{Corral: "c", Rootfs: "r", CPUs: 0.01, Percents: []int{5, 101}}, true},
		{"zero concurrency", LazyConfig{Corral: "c", Rootfs: "r", CPUs: 0.01, Concurrency: []int{0}}, true},
		{"more CPU than admitted", LazyConfig{Corral: "c", Rootfs: "r", CPUs: 64, Concurrency: []int{32}}, true},
		{"negative fill rate", LazyConfig{Corral: "c", Rootfs: "r", CPUs: 0.01, FillRate: -1}, true},
	}
	for _, tt := range tests {
		err := tt.cfg.withDefaults().Validate()
		if got := err != nil; got != tt.wantErr {
			t.Errorf("%s: Validate() = %v, want error %v", tt.name, err, tt.wantErr)
		}
	}
	d := LazyConfig{}.withDefaults()
	if d.ImageMiB != 1024 || d.Delay != 10*time.Millisecond || !slices.Equal(d.Concurrency, []int{1, 8, 32}) ||
		!slices.Equal(d.Percents, []int{5, 30, 100}) || d.CPUs != 0.25 || d.MemoryMiB != 128 || d.Samples != 8 || d.CompletionRounds != 3 {
		t.Errorf("defaults: got %+v", d)
	}
	if got := (LazyConfig{Delay: -1}).withDefaults().Delay; got != 0 {
		t.Errorf("negative delay: got %v, want 0 (none)", got)
	}
}

func TestPlanImage(t *testing.T) {
	for _, total := range []int64{64 << 20, 1 << 30} {
		p := planImage(1, total)
		var sum, small int64
		seen := map[string]bool{}
		for _, f := range p.files {
			sum += f.size
			if seen[f.rel] {
				t.Fatalf("%d: %s twice", total, f.rel)
			}
			seen[f.rel] = true
			if strings.Contains(f.rel, "/lib/") {
				small += f.size
				if f.size < 1 || f.size > smallMax {
					t.Errorf("%d: small file %s of %d bytes", total, f.rel, f.size)
				}
			} else if f.size > largeMax {
				t.Errorf("%d: large file %s of %d bytes", total, f.rel, f.size)
			}
		}
		if sum != total || p.total != total {
			t.Errorf("%d: files sum to %d (plan says %d)", total, sum, p.total)
		}
		if share := float64(small) / float64(total); share < 0.25 || share > 0.30 || small != p.small {
			t.Errorf("%d: small files hold %.3f of the bytes (%d, plan %d), want 0.25-0.30", total, share, small, p.small)
		}
		var units int64
		for u, idx := range p.units {
			var b int64
			for _, i := range idx {
				b += p.files[i].size
				if p.files[i].unit != u {
					t.Errorf("file %d is in unit %d, says %d", i, u, p.files[i].unit)
				}
			}
			if b != p.unitBytes[u] {
				t.Errorf("unit %d: %d bytes, plan says %d", u, b, p.unitBytes[u])
			}
			units += b
		}
		if units != total {
			t.Errorf("units hold %d bytes, want %d", units, total)
		}
		if q := planImage(1, total); !slices.Equal(q.files, p.files) {
			t.Errorf("%d: the same seed made another plan", total)
		}
	}
}

func TestSelectTasks(t *testing.T) {
	for _, total := range []int64{128 << 20, 1 << 30, 2 << 30} {
		p := planImage(7, total)
		pcts := []int{5, 30, 100}
		lists := selectTasks(p, 7, pcts)
		var prev []int
		for _, pct := range pcts {
			l := lists[pct]
			var b int64
			for _, i := range l {
				b += p.files[i].size
			}
			target := total * int64(pct) / 100
			tol := max(total/100, target/10)
			if b < target-tol || b > target+tol {
				t.Errorf("%d MiB, %d%%: %d bytes, want %d ± %d", total>>20, pct, b, target, tol)
			}
			if !slices.Equal(l[:len(prev)], prev) {
				t.Errorf("%d MiB, %d%%: does not start with the smaller list", total>>20, pct)
			}
			seen := map[int]bool{}
			for _, i := range l {
				if seen[i] {
					t.Fatalf("%d%%: file %d twice", pct, i)
				}
				seen[i] = true
			}
			prev = l
		}
		if len(lists[100]) != len(p.files) {
			t.Errorf("100%%: %d files, want all %d", len(lists[100]), len(p.files))
		}
	}
}

func TestWriteImage(t *testing.T) {
	p := planImage(3, 64<<20)
	lists := selectTasks(p, 3, []int{5, 100})
	dir := t.TempDir()
	if err := writeImage(dir, p, lists, 3); err != nil {
		t.Fatal(err)
	}
	for _, f := range p.files[:3] {
		fi, err := os.Stat(filepath.Join(dir, f.rel))
		if err != nil || fi.Size() != f.size {
			t.Fatalf("%s: %v, size %v, want %d", f.rel, err, fi, f.size)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, lazyRoot, "task", "list-5"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != len(lists[5]) || lines[0] != "/"+p.files[lists[5][0]].rel {
		t.Errorf("list-5: %d lines starting %q, want %d starting /%s", len(lines), lines[0], len(lists[5]), p.files[lists[5][0]].rel)
	}
	// Incompressible: no two 4 KiB blocks of a file alike, and not zeros.
	c, _ := os.ReadFile(filepath.Join(dir, p.files[len(p.files)-1].rel))
	if string(c[:4096]) == string(c[4096:8192]) || strings.Count(string(c[:4096]), "\x00") > 64 {
		t.Errorf("content does not look random")
	}
}

func TestIsLazydOf(t *testing.T) {
	dir := "/tmp/crl-lz-1/n3/layers/lazy"
	tests := []struct {
		args []string
		want bool
	}{
		{[]string{"/work/bin/corral", "lazyd", "--dir", dir, "--blob-store", "s3://b"}, true},
		{[]string{"corral", "lazyd", "--dir=" + dir}, true},
		{[]string{"corral", "lazyd", "--dir", dir + "x"}, false},
		{[]string{"corral", "up", "--data-dir", dir}, false},
		{[]string{"corral", "lazyd", "--dir"}, false},
		{[]string{"sh"}, false},
	}
	for _, tt := range tests {
		if got := isLazydOf(tt.args, dir); got != tt.want {
			t.Errorf("isLazydOf(%q) = %v, want %v", tt.args, got, tt.want)
		}
	}
}

func TestRotate(t *testing.T) {
	s := []string{"a", "b", "c"}
	for k, want := range [][]string{{"a", "b", "c"}, {"b", "c", "a"}, {"c", "a", "b"}, {"a", "b", "c"}} {
		if got := rotate(s, k); !slices.Equal(got, want) {
			t.Errorf("rotate(%d) = %v, want %v", k, got, want)
		}
	}
}

func TestLazyRatiosAndGoals(t *testing.T) {
	cell := func(kind, mode, node string, n, pct int, p50, p99 float64, written, fetched int64) LazyCell {
		return LazyCell{Kind: kind, Mode: mode, Node: node, Concurrency: n, Percent: pct,
			Latency: Stats{P50: p50, P99: p99}, Bytes: LazyBytes{NodeWritten: written, Fetched: fetched}}
	}
	cells := []LazyCell{
		cell(cellFirstOutput, "eager", "cold", 1, 5, 3000, 4000, 1000, 1000),
		cell(cellFirstOutput, "lazy", "cold", 1, 5, 1500, 2000, 100, 100),
		cell(cellFirstOutput, "prefetch", "cold", 1, 5, 900, 1600, 400, 200),
		cell(cellFirstOutput, "eager", "cold", 8, 5, 6000, 6000, 1000, 1000),
		cell(cellFirstOutput, "prefetch", "cold", 8, 5, 3000, 3000, 600, 200),
		cell(cellFirstOutput, "prefetch", "warm", 8, 5, 500, 500, 0, 0), // no eager warm: no ratio
		cell(cellCompletion, "eager", "cold", 1, 100, 10000, 10000, 1000, 1000),
		cell(cellCompletion, "lazy", "cold", 1, 100, 13000, 13000, 1000, 1000),
		cell(cellCompletion, "prefetch", "cold", 1, 100, 11000, 12500, 1000, 1000),
	}
	applyRatios(cells)
	if c := cells[2]; c.RatioP50 != 0.3 || c.RatioP99 != 0.4 || c.DiskRatio != 0.4 || c.FetchedRatio != 0.2 {
		t.Errorf("prefetch cold 1: ratios %v %v %v %v, want 0.3 0.4 0.4 0.2", c.RatioP50, c.RatioP99, c.DiskRatio, c.FetchedRatio)
	}
	if c := cells[5]; c.RatioP50 != 0 {
		t.Errorf("a cell without eager's got ratio %v", c.RatioP50)
	}
	if c := cells[0]; c.RatioP50 != 1 {
		t.Errorf("eager's own ratio %v, want 1", c.RatioP50)
	}
	goals := lazyGoals(cells)
	type g struct {
		goal      string
		n, pct    int
		pass, p99 bool
		p50, p99v float64
	}
	want := map[string]g{
		"ttfo1":  {"cold time to first output: eager ÷ prefetch", 1, 5, true, false, 3000.0 / 900, 2.5},
		"ttfo8":  {"cold time to first output: eager ÷ prefetch", 8, 5, false, false, 2, 2},
		"disk1":  {"cold disk bytes written: prefetch ÷ eager", 1, 5, true, true, 0.4, 0},
		"disk8":  {"cold disk bytes written: prefetch ÷ eager", 8, 5, false, false, 0.6, 0},
		"lazy":   {"100% read, completion time: lazy ÷ eager", 1, 100, false, false, 1.3, 1.3},
		"prefet": {"100% read, completion time: prefetch ÷ eager", 1, 100, true, false, 1.1, 1.25},
	}
	if len(goals) != len(want) {
		t.Fatalf("got %d goals, want %d: %+v", len(goals), len(want), goals)
	}
	for _, w := range want {
		i := slices.IndexFunc(goals, func(x LazyGoal) bool { return x.Goal == w.goal && x.Concurrency == w.n && x.Percent == w.pct })
		if i < 0 {
			t.Errorf("no goal %q at N=%d, %d%%", w.goal, w.n, w.pct)
			continue
		}
		x := goals[i]
		if x.Pass != w.pass || x.PassP99 != w.p99 || !near(x.P50, w.p50) || !near(x.P99, w.p99v) {
			t.Errorf("%q N=%d: got pass %v/%v, %v/%v; want %v/%v, %v/%v", w.goal, w.n, x.Pass, x.PassP99, x.P50, x.P99, w.pass, w.p99, w.p50, w.p99v)
		}
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

func TestNodeSampleMinus(t *testing.T) {
	b := nodeSample{up: 100, lazyd: 50, lazydPid: 7, st: LazyBytes{Fetched: 10, BlobRequests: 3}}
	a := nodeSample{up: 300, lazyd: 150, lazydPid: 7, st: LazyBytes{Fetched: 40, BlobRequests: 8}}
	if d := a.minus(b); d.NodeWritten != 300 || d.LazydWritten != 100 || d.Fetched != 30 || d.BlobRequests != 5 {
		t.Errorf("same lazyd: got %+v", d)
	}
	// A lazyd started during the round counts from zero.
	b.lazydPid = 0
	if d := a.minus(b); d.NodeWritten != 350 || d.LazydWritten != 150 || d.Fetched != 40 {
		t.Errorf("new lazyd: got %+v", d)
	}
}

// The proxy must forward the Host header unchanged (S3 signs it), add its delay to every
// request and count what passes.
func TestDelayProxy(t *testing.T) {
	var gotHost string
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotHost = r.Host
		body, _ := io.ReadAll(r.Body)
		w.Write([]byte(strings.Repeat("x", 1000) + string(body)))
	}))
	defer backend.Close()
	p, err := startDelayProxy(strings.TrimPrefix(backend.URL, "http://"), 30*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	start := time.Now()
	resp, err := http.Post("http://"+p.addr+"/bucket/key", "text/plain", strings.NewReader("hello"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Errorf("answered in %v, want at least the 30 ms delay", d)
	}
	if gotHost != p.addr {
		t.Errorf("backend saw Host %q, want the proxy's %q (as the client signed it)", gotHost, p.addr)
	}
	if len(b) != 1005 || p.requests.Load() != 1 || p.bytesIn.Load() != 1005 || p.bytesOut.Load() != 5 {
		t.Errorf("got %d bytes; counted %d requests, %d bytes in, %d out; want 1005, 1, 1005, 5", len(b), p.requests.Load(), p.bytesIn.Load(), p.bytesOut.Load())
	}
}

func TestDelayProxyBandwidth(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(make([]byte, 1<<20))
	}))
	defer backend.Close()
	p, err := startDelayProxy(strings.TrimPrefix(backend.URL, "http://"), 0, 10e6) // 10 MB/s
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	start := time.Now()
	resp, err := http.Get("http://" + p.addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if d := time.Since(start); n != 1<<20 || d < 80*time.Millisecond {
		t.Errorf("1 MiB at 10 MB/s: %d bytes in %v, want ~105 ms", n, d)
	}
}

func TestHistQuantile(t *testing.T) {
	bounds := []float64{1, 2, 5, 10}
	tests := []struct {
		counts []int64
		q      float64
		want   float64
	}{
		{nil, 0.5, 0},
		{[]int64{0, 0, 0, 0, 0}, 0.5, 0},
		{[]int64{10, 0, 0, 0, 0}, 0.99, 1},
		{[]int64{4, 0, 4, 2, 0}, 0.5, 5},
		{[]int64{5, 0, 4, 0, 1}, 0.99, -1},
		{[]int64{0, 0, 0, 100, 1}, 0.99, 10},
	}
	for _, tt := range tests {
		if got := histQuantile(bounds, tt.counts, tt.q); got != tt.want {
			t.Errorf("histQuantile(%v, %v) = %v, want %v", tt.counts, tt.q, got, tt.want)
		}
	}
	if got := addCounts([]int64{1, 2}, []int64{1, 1, 1}, -1); !slices.Equal(got, []int64{0, 1, -1}) {
		t.Errorf("addCounts: got %v", got)
	}
}
