package edge

import (
	"context"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/model"
)

// Layer deletion and garbage collection. A published version can be deleted when nothing names
// it (no tag, no saved environment, no snapshot above it: the store checks); its blob (record,
// EROFS image, cached copy) is then removed once no other version of this node or of the shared
// catalogue has the same content and no sandbox of this node (creating, running or paused) has it
// in its rootfs. GC sweeps every blob of the blob store the same way, for blobs left by a crash or
// by a refused publish, and then removes images that no record names.

// foreignImportGrace is how long GC leaves a blob that another Corral imported and no version
// names yet.
const foreignImportGrace = time.Hour

// DeleteLayer deletes the published version name:version and, when unused, its blob.
func (e *Edge) DeleteLayer(ctx context.Context, name, version string) (model.Layer, error) {
	if err := catalog.ValidateLayerName("name", "version", name, version); err != nil {
		return model.Layer{}, err
	}
	// A sandbox deleted just before may still have the layer mounted until its cleanup ends.
	if err := e.WaitCleanups(ctx); err != nil {
		return model.Layer{}, err
	}
	// The version goes first, without holding up creates: one that resolved it before is
	// admitted with its record, which the check below finds in use; one after finds no version.
	l, err := e.publisher.DeleteLayer(ctx, name, version)
	if err != nil {
		return model.Layer{}, err
	}
	if err := e.unshareVersion(ctx, l); err != nil {
		return l, fmt.Errorf("layer %s:%s deleted on this node, still listed in the shared catalogue: %w", name, version, err)
	}
	e.layersMu.Lock()
	removed, err := e.removeIfUnused(ctx, l.Digest)
	e.layersMu.Unlock()
	if err != nil {
		return l, fmt.Errorf("layer %s:%s deleted, its blob not: %w", name, version, err)
	}
	e.log.Info("layer deleted", "layer", name+":"+version, "digest", l.Digest, "blob_removed", removed)
	return l, nil
}

// GC removes every blob of the layer store that no published version and no sandbox uses, and
// returns how many it removed (blobs and orphaned images) and the bytes they held.
func (e *Edge) GC(ctx context.Context) (model.GCResult, error) {
	if err := e.WaitCleanups(ctx); err != nil {
		return model.GCResult{}, err
	}
	e.layersMu.Lock()
	defer e.layersMu.Unlock()
	var res model.GCResult
	blobs, err := e.layers.List(ctx)
	if err != nil {
		return res, err
	}
	var candidates []string
	size := map[string]int64{}
	for _, b := range blobs {
		// Another Corral writes its record before its ref: a blob it imported within the hour
		// may be about to be published.
		if b.ImportedBy != e.instance && time.Since(b.Imported) < foreignImportGrace {
			continue
		}
		candidates = append(candidates, b.Digest)
		size[b.Digest] = b.Size
	}
	unused, err := e.unusedDigests(ctx, candidates)
	if err != nil {
		return res, err
	}
	for _, d := range unused {
		if err := e.layers.Remove(ctx, d); err != nil {
			return res, err
		}
		res.Removed++
		res.Bytes += size[d]
	}
	n, bytes, err := e.layers.CollectImages(ctx)
	if err != nil {
		return res, err
	}
	res.Removed += n
	res.Bytes += bytes
	e.log.Info("layer store collected", "removed", res.Removed, "bytes", res.Bytes)
	return res, nil
}

// LayerUse says which layer blobs a published version names or a live sandbox of any node has
// in its rootfs: the store (store.DigestsInUse), or a cluster's servers (nodeproto.Digests),
// which see every node's sandboxes.
type LayerUse interface {
	DigestsInUse(ctx context.Context, digests []string) (map[string]bool, error)
}

// removeIfUnused removes digest's blob unless it is in use (unusedDigests). Preconditions:
// e.layersMu is held for writing.
func (e *Edge) removeIfUnused(ctx context.Context, digest string) (bool, error) {
	unused, err := e.unusedDigests(ctx, []string{digest})
	if err != nil || len(unused) == 0 {
		return false, err
	}
	if err := e.layers.Remove(ctx, digest); err != nil {
		return false, err
	}
	return true, nil
}

// unusedDigests returns those of digests that no published version (of this node or of the
// shared catalogue), no live sandbox of any node and no pooled sandbox of this one uses: one
// question to the store or the servers and one listing of the shared catalogue, whatever the
// number of digests. Preconditions: e.layersMu is held for writing.
func (e *Edge) unusedDigests(ctx context.Context, digests []string) ([]string, error) {
	if len(digests) == 0 {
		return nil, nil
	}
	inUse, err := e.layerUse.DigestsInUse(ctx, digests)
	if err != nil {
		return nil, err
	}
	shared, err := e.sharedDigests(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, d := range digests {
		// A pooled sandbox has no record but the blob in its rootfs.
		if !inUse[d] && !shared[d] && !e.warm.usesDigest(d) {
			out = append(out, d)
		}
	}
	return out, nil
}
