package daemon

import (
	"github.com/corral-dev/corral/internal/edge"
	"github.com/corral-dev/corral/internal/runtime/qemu"
	"github.com/corral-dev/corral/internal/runtime/runc"
)

// diskHolders are what the edge's disk promise counts besides its live sandboxes' limits: the
// runc runtime's pool of disks made ahead, and what every runtime's disks have allocated on the
// data dir's filesystem. Volumes, when they come, add theirs here.
func diskHolders(rt *runc.Runtime, vm *qemu.Runtime) []edge.DiskHolder {
	return []edge.DiskHolder{
		func() edge.DiskHeld {
			u := rt.DiskUse()
			return edge.DiskHeld{Promised: u.Pooled, Allocated: u.Allocated}
		},
		func() edge.DiskHeld { return edge.DiskHeld{Allocated: vm.DiskAllocated()} },
	}
}

// diskAllocated sums what the holders have allocated.
func diskAllocated(hs []edge.DiskHolder) int64 {
	var n int64
	for _, h := range hs {
		n += h().Allocated
	}
	return n
}
