package runc

import (
	"context"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/runtime"
)

// TestDiskAllocated: a sandbox's disk image holds all its blocks on the host from its create
// (so a full host cannot take them back), a --sparse-disks one none beyond what mkfs wrote, and
// DiskUse counts the sandbox's and the pool's disks.
func TestDiskAllocated(t *testing.T) {
	for _, sparse := range []bool{false, true} {
		e := newTestEnv(t, func(c *Config) { c.SparseDisks, c.DiskPool = sparse, -1 })
		s := e.spec("disk")
		s.DiskBytes = 48 << 20
		if _, err := e.r.Create(context.Background(), runtime.Spec(s)); err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(e.cfg.StateDir, "disk", diskImage), &st); err != nil {
			t.Fatal(err)
		}
		allocated := st.Blocks * 512
		if !sparse && allocated < s.DiskBytes {
			t.Errorf("disk image allocates %d of %d bytes; want all", allocated, s.DiskBytes)
		}
		if sparse && allocated > s.DiskBytes/2 {
			t.Errorf("sparse disk image allocates %d of %d bytes", allocated, s.DiskBytes)
		}
		if u := e.r.DiskUse(); u.Allocated != min(allocated, s.DiskBytes) || u.Pooled != 0 {
			t.Errorf("DiskUse = %+v, want allocated %d and nothing pooled", u, allocated)
		}
	}
}
