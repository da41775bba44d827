package edge

import (
	"context"
	"fmt"

	"github.com/corral-dev/corral/internal/store"
	corral "github.com/corral-dev/corral/sdk/go"
)

// Layer deletion and garbage collection. A published version can be deleted when nothing names
// it (no tag, no saved environment, no snapshot above it: the store checks); its tree is then
// removed once no other version has the same content and no sandbox of this node (creating,
// running or paused) has it in its rootfs. GC sweeps every tree in the layer store the same way,
// for trees left by a crash.

// DeleteLayer deletes the published version name:version and, when unused, its tree.
func (e *Edge) DeleteLayer(ctx context.Context, name, version string) (corral.Layer, error) {
	if err := ValidateLayerName("name", name, version); err != nil {
		return corral.Layer{}, err
	}
	e.layersMu.Lock()
	defer e.layersMu.Unlock()
	l, err := e.store.DeleteLayer(ctx, name, version)
	if err != nil {
		return corral.Layer{}, err
	}
	removed, err := e.removeIfUnused(ctx, l.Digest)
	if err != nil {
		return l, fmt.Errorf("layer %s:%s deleted, its tree not: %w", name, version, err)
	}
	e.log.Info("layer deleted", "layer", name+":"+version, "digest", l.Digest, "tree_removed", removed)
	return l, nil
}

// GC removes every tree of the layer store that no published version and no sandbox uses, and
// returns how many it removed and the bytes they held.
func (e *Edge) GC(ctx context.Context) (corral.GCResult, error) {
	e.layersMu.Lock()
	defer e.layersMu.Unlock()
	var res corral.GCResult
	blobs, err := e.layers.List()
	if err != nil {
		return res, err
	}
	for _, b := range blobs {
		removed, err := e.removeIfUnused(ctx, b.Digest)
		if err != nil {
			return res, err
		}
		if removed {
			res.Removed++
			res.Bytes += b.Size
		}
	}
	e.log.Info("layer store collected", "removed", res.Removed, "bytes", res.Bytes)
	return res, nil
}

// removeIfUnused removes digest's tree unless a published version or a live sandbox uses it.
// Preconditions: e.layersMu is held for writing.
func (e *Edge) removeIfUnused(ctx context.Context, digest string) (bool, error) {
	if inUse, err := e.store.LayerDigestInUse(ctx, digest); err != nil || inUse {
		return false, err
	}
	recs, err := e.store.ListSandboxes(ctx, store.SandboxFilter{States: []string{corral.StateCreating, corral.StateRunning, corral.StatePaused}})
	if err != nil {
		return false, err
	}
	for _, r := range recs {
		for _, d := range r.Lower {
			if d == digest {
				return false, nil
			}
		}
	}
	if err := e.layers.Remove(digest); err != nil {
		return false, err
	}
	return true, nil
}
