package edge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/layers"
	"github.com/corral-dev/corral/internal/model"
)

// Snapshots (pack_diff). A snapshot is the sandbox's writable layer — what it changed on top of
// its layers, deletions as whiteouts, without what a layer cannot hold (devices, sockets, names
// spelling whiteouts: reported in SnapshotOf.Skipped) and without privilege (the layer store
// strips setuid/setgid and file capabilities, drops security.* and trusted.*) — published as an
// immutable layer of kind snapshot that records the environment below it. The sandbox is frozen (or already paused) while its upper
// dir is read, so no half-written state is packed. A sandbox made from a snapshot stacks the
// environment, the snapshot's parents and the snapshot; a snapshot of such a sandbox stores only
// its own diff and lists the chain below it.

// maxExcludes bounds the exclusion list of one snapshot.
const maxExcludes = 256

// maxSkipped bounds the skipped entries a snapshot lists (it counts them all).
const maxSkipped = 100

// Snapshot publishes the writable layer of sandbox id as name:version.
func (e *Edge) Snapshot(ctx context.Context, id string, req model.SnapshotRequest) (model.Layer, error) {
	if err := catalog.ValidateLayerName("name", "version", req.Name, req.Version); err != nil {
		return model.Layer{}, err
	}
	excludes, err := cleanExcludes(req.Exclude)
	if err != nil {
		return model.Layer{}, err
	}
	sb, err := e.ownSandbox(ctx, id)
	if err != nil {
		return model.Layer{}, err
	}
	ctx = context.WithoutCancel(ctx)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.gone {
		return model.Layer{}, errdefs.Conflict("sandbox %s stopped", id)
	}
	rec, err := e.record(ctx, id)
	if err != nil {
		return model.Layer{}, err
	}
	if rec.Runtime != RuntimeRunc {
		return model.Layer{}, errdefs.Invalid("runtime", "sandbox %s runs on %s: snapshots are taken of runc sandboxes only (gVisor keeps file data inside its own kernel, so the host never sees a consistent writable layer)", id, rec.Runtime)
	}
	at, err := iam.ParsePath("project", rec.Project)
	if err != nil {
		return model.Layer{}, err
	}
	// A version taken is refused before the work. (One the project does not see is refused by
	// the publish: names are one namespace.)
	if _, err := e.reader.VisibleLayer(ctx, at, req.Name, req.Version); err == nil {
		return model.Layer{}, errdefs.Conflict("layer %s:%s is already published; versions are immutable, publish a new version", req.Name, req.Version)
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return model.Layer{}, err
	}
	// What the sandbox made that a layer cannot hold (devices, sockets, .wh. names that would
	// become whiteouts) is left out and reported, not a failure.
	var skipped []model.SnapshotSkip
	skippedCount := 0
	tarOpts := layers.TarOptions{Exclude: excludes, Skip: func(s layers.Skipped) {
		skippedCount++
		if len(skipped) < maxSkipped {
			skipped = append(skipped, model.SnapshotSkip{Path: "/" + s.Path, Reason: s.Reason})
		}
	}}
	start := time.Now()
	blob, frozen, took, err := e.packUpperLocked(ctx, sb, tarOpts)
	if err != nil {
		return model.Layer{}, fmt.Errorf("snapshot sandbox %s: %w", id, err)
	}
	of := &model.SnapshotOf{Base: rec.Base, Workspace: rec.Workspace, Toolkits: rec.Toolkits, Sandbox: id}
	if rec.FromSnapshot != "" {
		name, version, _ := catalog.ParseLayerRef("from_snapshot", rec.FromSnapshot)
		parent, err := e.reader.VisibleLayer(ctx, at, name, version)
		if err != nil {
			return model.Layer{}, fmt.Errorf("snapshot sandbox %s: parent snapshot: %w", id, err)
		}
		if parent.Snapshot != nil {
			of.Parents = append(append(of.Parents, parent.Snapshot.Parents...), rec.FromSnapshot)
		}
	}
	for _, x := range excludes {
		of.Excluded = append(of.Excluded, "/"+x)
	}
	of.Skipped, of.SkippedCount = skipped, skippedCount
	l, created, err := e.PublishLayer(ctx, model.Layer{
		Name: req.Name, Version: req.Version, Kind: model.KindSnapshot, Digest: blob.Digest,
		Size: blob.Size, Files: blob.Files, CreatedAt: time.Now().UTC(), Snapshot: of, Project: rec.Project,
		Public: req.Public,
	})
	if err != nil {
		return model.Layer{}, err
	}
	if !created && l.Digest != blob.Digest {
		// The same content under the same version is this snapshot's own publish, answered
		// again after its answer broke off (or an identical snapshot's, which is as good).
		return model.Layer{}, errdefs.Conflict("layer %s:%s is already published", req.Name, req.Version)
	}
	e.log.Info("snapshot published", "sandbox", id, "layer", req.Name+":"+req.Version, "digest", blob.Digest,
		"bytes", blob.Size, "files", blob.Files, "skipped", skippedCount, "frozen", frozen, "read_took", took.Round(time.Millisecond),
		"took", time.Since(start).Round(time.Millisecond))
	return l, nil
}

// cleanExcludes validates exclusion paths (absolute, inside the rootfs) and returns them
// relative to the root, cleaned.
func cleanExcludes(in []string) ([]string, error) {
	if len(in) > maxExcludes {
		return nil, errdefs.Invalid("exclude", "at most %d paths, got %d", maxExcludes, len(in))
	}
	out := make([]string, 0, len(in))
	for i, p := range in {
		field := fmt.Sprintf("exclude[%d]", i)
		if err := checkPath(field, p); err != nil {
			return nil, err
		}
		for _, part := range strings.Split(p, "/") {
			if part == ".." {
				return nil, errdefs.Invalid(field, "%q leaves the sandbox's root filesystem", p)
			}
		}
		c := strings.TrimPrefix(path.Clean(p), "/")
		if c == "" {
			return nil, errdefs.Invalid(field, "excluding / would leave nothing to snapshot")
		}
		out = append(out, c)
	}
	return out, nil
}

// packUpperLocked imports the writable layer of sandbox sb as a layer blob: the sandbox is
// frozen (unless paused) while its upper directory is read, and runs again while the layer
// store converts and stores the copy. It reports whether it froze the sandbox and how long the
// read took. The skip callback of opts is called from another goroutine, before this returns.
//
// Preconditions: sb.mu is held; the sandbox is a runc sandbox.
func (e *Edge) packUpperLocked(ctx context.Context, sb *sandbox, opts layers.TarOptions) (layers.Blob, bool, time.Duration, error) {
	id := sb.id
	upper, err := e.rt.UpperDir(id)
	if err != nil {
		return layers.Blob{}, false, 0, err
	}
	start := time.Now()
	frozen := !sb.paused.Load()
	if frozen {
		if err := e.rt.Freeze(ctx, id); err != nil {
			return layers.Blob{}, false, 0, err
		}
	}
	readDone := make(chan time.Duration, 1)
	pr, pw := io.Pipe()
	go func() {
		err := layers.WriteTarWith(ctx, upper, pw, opts)
		if frozen {
			e.rt.Thaw(ctx, id)
		}
		readDone <- time.Since(start)
		pw.CloseWithError(err)
	}()
	blob, err := e.layers.ImportTar(ctx, pr)
	pr.CloseWithError(err)
	took := <-readDone
	return blob, frozen, took, err
}
