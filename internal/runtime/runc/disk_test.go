package runc

import (
	"context"
	"path/filepath"
	"testing"
	"time"

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

// TestRefillWaitsForCreates: while a Create is in flight the pool is refilled only below half
// its slots, and the rest follows once the last Create ends.
func TestRefillWaitsForCreates(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.DiskPool = 4 })
	r := e.r
	waitReady := func(n int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for len(r.ready) != n {
			if time.Now().After(deadline) {
				t.Fatalf("pool holds %d slots, want %d", len(r.ready), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitReady(4)
	r.creating.Add(1) // a Create in flight
	var taken []string
	take := func() {
		slot, pooled, err := r.takeSlot(context.Background(), e.cfg.DefaultDiskBytes)
		if err != nil || !pooled {
			t.Fatalf("takeSlot: pooled %v, %v", pooled, err)
		}
		taken = append(taken, slot)
	}
	t.Cleanup(func() {
		for _, s := range taken {
			teardownDir(context.Background(), s)
		}
	})
	take()
	// 3 of 4 left: the refill waits (a wrong one made its mkfs in this time on any host).
	time.Sleep(500 * time.Millisecond)
	if n := len(r.ready); n != 3 {
		t.Fatalf("pool refilled to %d while a create was in flight with 3 of 4 slots ready", n)
	}
	take()
	take()
	// 1 of 4: below half, refilled at once, to half.
	waitReady(2)
	time.Sleep(500 * time.Millisecond)
	if n := len(r.ready); n != 2 {
		t.Fatalf("pool refilled to %d while a create was in flight, want 2 (half)", n)
	}
	if r.creating.Add(-1) == 0 {
		r.kickRefill() // what the Create that ends last does
	}
	waitReady(4)
}
