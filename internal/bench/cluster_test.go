package bench

import (
	"context"
	"errors"
	"github.com/corral-dev/corral/internal/mountinfo"
	"sync/atomic"
	"testing"
	"time"
)

func TestClusterConfigValidate(t *testing.T) {
	ok := ClusterConfig{Corral: "/bin/corral", Rootfs: "/rootfs"}
	tests := []struct {
		name    string
		cfg     ClusterConfig
		wantErr bool
	}{
		{"defaults", ok, false},
		{"no binary", ClusterConfig{Rootfs: "/rootfs"}, true},
		{"no rootfs", ClusterConfig{Corral: "/bin/corral"}, true},
		{"negative creates", ClusterConfig{Corral: "c", Rootfs: "r", Creates: -1}, true},
		{"negative concurrency", ClusterConfig{Corral: "c", Rootfs: "r", Concurrency: -2}, true},
		{"tiny memory", ClusterConfig{Corral: "c", Rootfs: "r", MemoryMiB: 4}, true},
		{"negative pool", ClusterConfig{Corral: "c", Rootfs: "r", DiskPool: -1}, true},
		{"more rounds than creates", ClusterConfig{Corral: "c", Rootfs: "r", Creates: 3, Rounds: 4}, true},
	}
	for _, tt := range tests {
		err := tt.cfg.withDefaults().Validate()
		if got := err != nil; got != tt.wantErr {
			t.Errorf("%s: Validate() = %v, want error %v", tt.name, err, tt.wantErr)
		}
	}
	d := ok.withDefaults()
	if d.Creates != 60 || d.Concurrency != 8 || d.CPUs != 0.25 || d.MemoryMiB != 64 || d.DiskPool != 6 || d.Rounds != 4 {
		t.Errorf("defaults: got %+v", d)
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"/tmp/crl-cb-1/e1/disk", "/tmp/crl-cb-1/e1/disk"},
		{`/tmp/a\040b`, "/tmp/a b"},
		{`/tmp/tab\011`, "/tmp/tab\t"},
		{`/tmp/back\134slash`, `/tmp/back\slash`},
		{`/tmp/short\04`, `/tmp/short\04`},
	} {
		if got := mountinfo.Unescape(tt.in); got != tt.want {
			t.Errorf("mountinfo.Unescape(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestUnder(t *testing.T) {
	dirs := []string{"/tmp/crl-cb-1"}
	for _, tt := range []struct {
		path string
		want bool
	}{
		{"/tmp/crl-cb-1", true},
		{"/tmp/crl-cb-1/e1/sandboxes", true},
		{"/tmp/crl-cb-12", false},
		{"/tmp", false},
	} {
		if got := under(tt.path, dirs); got != tt.want {
			t.Errorf("under(%q) = %v, want %v", tt.path, got, tt.want)
		}
	}
}

func TestParallel(t *testing.T) {
	var n atomic.Int64
	if _, err := parallel(t.Context(), 50, 4, func(context.Context, int) error { n.Add(1); return nil }); err != nil || n.Load() != 50 {
		t.Fatalf("parallel: ran %d of 50, %v", n.Load(), err)
	}
	// The first error stops the work not yet started and is returned.
	boom := errors.New("boom")
	n.Store(0)
	_, err := parallel(t.Context(), 1000, 2, func(_ context.Context, i int) error {
		n.Add(1)
		if i == 3 {
			return boom
		}
		time.Sleep(time.Millisecond)
		return nil
	})
	if !errors.Is(err, boom) || n.Load() > 10 {
		t.Fatalf("parallel after an error: ran %d, err %v; want boom and a stop", n.Load(), err)
	}
}
