package qemu

import (
	"context"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime"
)

// Fork would take a memory snapshot and disk of a running VM for copies to restore. It is not
// built yet: a microvm's fork is refused (the edge says so before it gets here).
func (r *Runtime) Fork(ctx context.Context, id string, opts runtime.ForkOptions) (*runtime.ForkImage, error) {
	return nil, errdefs.Conflict("sandbox %s is a microVM: forking microVMs is not available yet (fork a gVisor sandbox, or a runc one with disk_only)", id)
}

// DropFork does nothing: Fork takes no image.
func (r *Runtime) DropFork(img *runtime.ForkImage) {}
