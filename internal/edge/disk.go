package edge

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/store"
)

// DiskConfig admits creates against the disk of the filesystem that holds the node's sandbox
// disks (the data dir's). The node's promise is the disk limits of its live sandboxes plus what
// its holders promise (pooled disks, volumes); a create is refused with 409 node_full when the
// promise with its own disk limit would exceed what the filesystem can hold for them, times
// Overcommit. What the filesystem can hold is its free space plus what the promised disks have
// taken from it already: with disks allocated when they are made (runc's disk.go), a promise of
// Overcommit 1 is kept by the filesystem itself.
type DiskConfig struct {
	// Dir is a directory on the filesystem (the data dir).
	Dir string
	// Overcommit is how far the promise may exceed what the filesystem can hold (default 1).
	// Above 1 it only means something for disks made sparse (corral up --sparse-disks).
	Overcommit float64
	// Keep is free space never promised: room for Corral's own writes (the store).
	Keep int64
	// Holders report disk held on the filesystem besides live sandboxes' limits: the runtimes'
	// pools and the disks they have allocated, volumes. Each is called at every admission.
	Holders []DiskHolder
}

// DiskHolder reports what something on the node holds of the data dir's filesystem.
type DiskHolder func() DiskHeld

// DiskHeld is disk held on the data dir's filesystem by something other than the edge's records.
type DiskHeld struct {
	// Promised is disk promised beyond the live sandboxes' limits (which the edge counts from its
	// records): disks made ahead for sandboxes to come, volumes.
	Promised int64
	// Allocated is what promised disks (live sandboxes' included) have taken from the filesystem.
	Allocated int64
}

// DiskPromise is the node's disk account at one moment.
type DiskPromise struct {
	// Promised is the disk limits of the live sandboxes plus the holders' promises.
	Promised int64
	// Allocated is what of Promised is taken from the filesystem already (at most Promised).
	Allocated int64
	// Free is the filesystem's free space (for unprivileged use: root's reserve stays the host's)
	// less DiskConfig.Keep.
	Free int64
	// Overcommit is DiskConfig.Overcommit.
	Overcommit float64
}

// Have is what the filesystem can hold for promised disks: its free space plus what they have
// taken already, times the overcommit.
func (d DiskPromise) Have() int64 {
	return int64(float64(d.Free+d.Allocated) * d.Overcommit)
}

// DiskPromise reports the node's disk account; ok is false without Config.Disk.
func (e *Edge) DiskPromise() (d DiskPromise, ok bool, err error) {
	c := e.cfg.Disk
	if c == nil {
		return d, false, nil
	}
	d, err = c.promise(e.nodeUsage().DiskBytes)
	return d, true, err
}

func (c *DiskConfig) promise(sandboxes int64) (DiskPromise, error) {
	d := DiskPromise{Promised: sandboxes, Overcommit: c.Overcommit}
	for _, h := range c.Holders {
		held := h()
		d.Promised += held.Promised
		d.Allocated += held.Allocated
	}
	d.Allocated = min(d.Allocated, d.Promised)
	var fs unix.Statfs_t
	if err := unix.Statfs(c.Dir, &fs); err != nil {
		return d, fmt.Errorf("read free space of %s: %w", c.Dir, err)
	}
	d.Free = max(0, int64(fs.Bavail)*fs.Bsize-c.Keep)
	return d, nil
}

// admitDiskLocked refuses rec when its disk limit does not fit the node's disk promise.
// Preconditions: e.capMu is held (so concurrent creates cannot both take the last room).
func (e *Edge) admitDiskLocked(rec *store.Sandbox) error {
	d, _, err := e.DiskPromise()
	if err != nil {
		return err
	}
	if have := d.Have(); d.Promised+rec.Limits.DiskBytes > have {
		return fmt.Errorf("node %s has no room for sandbox %s: disk: have %s (free %s + %s its disks hold, ×%g), promised %s, asked %s; delete sandboxes or ask for less disk (limits.disk_bytes): %w",
			e.cfg.Node, rec.ID, formatBytes(have), formatBytes(d.Free), formatBytes(d.Allocated), d.Overcommit,
			formatBytes(d.Promised), formatBytes(rec.Limits.DiskBytes), errdefs.ErrNodeFull)
	}
	return nil
}

// formatBytes writes n in binary units with one decimal (1.5 GiB).
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
