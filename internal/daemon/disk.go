package daemon

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/edge"
	"github.com/corral-dev/corral/internal/runtime"
)

// diskHolders are what the edge's disk promise counts besides its live sandboxes' limits: what
// each runtime backend holds on the data dir's filesystem (runc's pool of disks made ahead,
// every backend's allocated disks). Volumes add theirs where they are opened (Run).
func diskHolders(s *runtime.Set) []edge.DiskHolder {
	var hs []edge.DiskHolder
	for _, b := range runtime.Backends[runtime.DiskHolder](s) {
		hs = append(hs, func() edge.DiskHeld {
			p, a := b.DiskHeld()
			return edge.DiskHeld{Promised: p, Allocated: a}
		})
	}
	return hs
}

// diskAllocated sums what the holders have allocated.
func diskAllocated(hs []edge.DiskHolder) int64 {
	var n int64
	for _, h := range hs {
		n += h().Allocated
	}
	return n
}

// reserveBytes is the data dir's disk kept for Corral's own writes when the filesystem fills:
// the store's records of deletes (which give disk back) and of sandboxes' ends.
const reserveBytes = 32 << 20

// diskReserve is a file of reserveBytes allocated in the data dir. When the store finds the
// disk full it is removed, so the write can go through; it is made again once the filesystem
// has room. The edge never promises the same amount of free space (edge.DiskConfig.Keep), so
// only something other than sandboxes' disks can fill the filesystem to where it is needed.
type diskReserve struct {
	path string
	log  *slog.Logger
	mu   sync.Mutex // serialises release and make
}

func newDiskReserve(dataDir string, log *slog.Logger) *diskReserve {
	return &diskReserve{path: filepath.Join(dataDir, "disk.reserve"), log: log}
}

// make allocates the reserve when it is missing and the filesystem has room for it and as much
// again; it reports whether the reserve exists.
func (r *diskReserve) make() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if fi, err := os.Stat(r.path); err == nil && fi.Size() == reserveBytes {
		return true
	}
	var fs unix.Statfs_t
	if unix.Statfs(filepath.Dir(r.path), &fs) != nil || int64(fs.Bavail)*fs.Bsize < 2*reserveBytes {
		return false
	}
	f, err := os.OpenFile(r.path, os.O_CREATE|os.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err == nil {
		err = unix.Fallocate(int(f.Fd()), 0, 0, reserveBytes)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		os.Remove(r.path)
		r.log.Warn("keep a disk reserve for the store", "path", r.path, "err", err)
		return false
	}
	return true
}

// release removes the reserve; it reports whether there was one to give.
func (r *diskReserve) release() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if os.Remove(r.path) != nil {
		return false
	}
	r.log.Error("the data dir's filesystem is full: gave the store its disk reserve; delete sandboxes or free disk", "reserve_bytes", reserveBytes)
	return true
}

// keep makes the reserve again whenever it is missing and there is room, until ctx ends.
func (r *diskReserve) keep(ctx context.Context) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.make()
		}
	}
}
