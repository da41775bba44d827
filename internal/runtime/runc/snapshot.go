package runc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// UpperDir returns the host path of the sandbox's writable layer (the overlay's upper dir):
// exactly what the sandbox changed on top of its layers, with overlay whiteouts for deletions.
// Read it only while the sandbox is frozen (Freeze) or paused, so no half-written state is seen.
func (r *Runtime) UpperDir(id string) (string, error) {
	if !validID(id) {
		return "", errdefs.Invalid("ID", "%q is not a valid sandbox ID", id)
	}
	dir := filepath.Join(r.dir(id), diskMount, "upper")
	if _, err := os.Stat(dir); err != nil {
		return "", errdefs.NotFound("writable layer of sandbox %s", id)
	}
	return dir, nil
}

// Freeze stops every process of the sandbox in place (cgroup freezer) without touching its
// memory, for a consistent read of its writable layer; Thaw lets them run again. A frozen sandbox
// reports StatePaused until thawed. Callers must not Freeze a sandbox that Pause paused.
func (r *Runtime) Freeze(ctx context.Context, id string) error {
	if !validID(id) {
		return errdefs.Invalid("ID", "%q is not a valid sandbox ID", id)
	}
	unlock := r.locks.lock(id)
	defer unlock()
	if r.engineOf(id) == EngineGVisor {
		return errdefs.Invalid("Runtime", "sandbox %s runs on gVisor, whose writable layer cannot be read consistently while it runs: snapshots need a runc sandbox", id)
	}
	if err := r.cg.Freeze(ctx, id, 5*time.Second); err != nil {
		r.cg.Thaw(id)
		return fmt.Errorf("freeze sandbox %s: %w", id, err)
	}
	return nil
}

// Thaw undoes Freeze.
func (r *Runtime) Thaw(ctx context.Context, id string) error {
	if !validID(id) {
		return errdefs.Invalid("ID", "%q is not a valid sandbox ID", id)
	}
	unlock := r.locks.lock(id)
	defer unlock()
	if err := r.cg.Thaw(id); err != nil {
		return fmt.Errorf("thaw sandbox %s: %w", id, err)
	}
	return nil
}
