package edge

import (
	"context"
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/limits"
	"github.com/corral-dev/corral/internal/model"
)

// TestDiskAdmission fills the node's disk promise to a known margin below the data dir's free
// space (by a holder's promise, as a pool's or a volume's): creates fit until the margin is
// spent, the next is node_full naming disk, and a delete makes room again.
func TestDiskAdmission(t *testing.T) {
	dir := t.TempDir()
	free := func() int64 {
		var fs unix.Statfs_t
		if err := unix.Statfs(dir, &fs); err != nil {
			t.Fatal(err)
		}
		return int64(fs.Bavail) * fs.Bsize
	}
	if f := free(); f < 4<<30 {
		t.Skipf("needs 4 GiB free under %s, has %d bytes", dir, f)
	}
	// The holder's promise follows the free space, 2.5 GiB below it at every admission: other
	// test packages write and delete gigabytes on this filesystem meanwhile. Half a GiB either
	// way absorbs what they do between the holder's reading and the admission's.
	var held int64
	e, _ := newTestEdgeWith(t, newFakeRuntime(), Config{Disk: &DiskConfig{Dir: dir, Holders: []DiskHolder{
		func() DiskHeld { held = free() - 5<<29; return DiskHeld{Promised: held} },
	}}})
	ctx := context.Background()
	req := model.CreateRequest{Base: "base:1", Limits: model.Limits{DiskBytes: 1 << 30}}
	var ids []string
	for range 2 {
		rec, err := e.Create(ctx, req)
		if err != nil {
			t.Fatalf("create within the promise: %v", err)
		}
		ids = append(ids, rec.ID)
	}
	_, err := e.Create(ctx, req)
	if !errors.Is(err, errdefs.ErrNodeFull) || !strings.Contains(err.Error(), "disk: have") {
		t.Fatalf("create beyond the promise: err = %v, want node_full naming disk", err)
	}
	d, ok, err := e.DiskPromise()
	if err != nil || !ok {
		t.Fatalf("DiskPromise: %v %v", ok, err)
	}
	if want := held + 2<<30; d.Promised != want {
		t.Errorf("promised = %d, want %d (the holder's and two sandboxes' limits)", d.Promised, want)
	}
	if _, err := e.Delete(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Create(ctx, req); err != nil {
		t.Fatalf("create after a delete freed room: %v", err)
	}
}

func TestDiskConfigValidate(t *testing.T) {
	for _, oc := range []float64{0.01, 1000} {
		c := Config{AgentPath: "/agent", Disk: &DiskConfig{Dir: "/", Overcommit: oc}}
		c.setDefaults()
		if err := c.Validate(); errdefs.Field(err) != "overcommit-disk" {
			t.Errorf("overcommit %g: err = %v, want invalid overcommit-disk", oc, err)
		}
	}
	c := Config{AgentPath: "/agent", Limits: limits.Config{DefaultDiskBytes: limits.MaxDiskBytes + 1}}
	c.setDefaults()
	if err := c.Validate(); errdefs.Field(err) != "sandbox-disk" {
		t.Errorf("default disk above the ceiling: err = %v, want invalid sandbox-disk", err)
	}
}
