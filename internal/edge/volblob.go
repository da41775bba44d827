package edge

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/store"
)

// Volumes in a cluster. A volume's image lives in the blob store (Config.Shared), one object per
// version, volumes/<id>/<version>.ext4.zst (zstd of the whole image; the record's digest is the
// SHA-256 of the image itself). A volume is made lazily: its record starts at version 0 and the
// first node to attach it makes an empty filesystem there. Attach: after the admission
// transaction took the attachment, the node uses its cached image if it is the record's version
// and digest, else downloads that version (verifying the digest) and records its copy for
// placement. A writer's image loses its version marker before it is mounted (it is changing).
// Detach of a writer: once its sandbox is gone and the journal is replayed (recoverVolumes), the
// node uploads the image as the next version and commits it in the store, conditional on the
// sandbox still holding the read-write attachment, before the sandbox's record releases it; so
// the next attach anywhere sees the last detach's upload. Readers never upload.

// VolumeCatalog is what a cluster's edge reads and records of its sandboxes' volumes: the
// servers (nodeproto.Volumes), which check that the sandbox is the node's and has the volume
// attached, or the store (storeVolumes) with servers of an older release. Each call names the
// sandbox it acts for.
type VolumeCatalog interface {
	// AttachedVolume returns the size, version and digest of volume id, which sandbox has
	// attached.
	AttachedVolume(ctx context.Context, sandbox, id string) (*store.VolumeRecord, error)
	// CommitVolume records version of volume id with its image's digest, written by sandbox
	// (its writer), and the node as holding it: a conflict unless sandbox still has it
	// attached read-write at version-1.
	CommitVolume(ctx context.Context, sandbox, id string, version int64, digest string) error
	// RecordVolumeCopy records that the node holds version of volume id, fetched for sandbox.
	RecordVolumeCopy(ctx context.Context, sandbox, id string, version int64) error
	// VolumeVersions returns the current version of each volume of ids that still exists.
	VolumeVersions(ctx context.Context, ids []string) (map[string]int64, error)
}

// storeVolumes is the VolumeCatalog of the store.
type storeVolumes struct {
	st   *store.Store
	node string
}

func (s storeVolumes) AttachedVolume(ctx context.Context, _, id string) (*store.VolumeRecord, error) {
	return s.st.GetVolumeByID(ctx, id)
}

func (s storeVolumes) CommitVolume(ctx context.Context, sandbox, id string, version int64, digest string) error {
	return s.st.CommitVolumeVersion(ctx, id, sandbox, s.node, version, digest)
}

func (s storeVolumes) RecordVolumeCopy(ctx context.Context, _, id string, version int64) error {
	return s.st.SetVolumeCopy(ctx, id, s.node, version)
}

func (s storeVolumes) VolumeVersions(ctx context.Context, ids []string) (map[string]int64, error) {
	out := make(map[string]int64, len(ids))
	for batch := range slices.Chunk(ids, store.MaxVolumeVersions) {
		v, err := s.st.VolumeVersions(ctx, batch)
		if err != nil {
			return nil, err
		}
		maps.Copy(out, v)
	}
	return out, nil
}

// clustered reports whether this node keeps volumes in the blob store.
func (e *Edge) clustered() bool { return e.cfg.SharedStore }

// volumeLocks serialises one node's fetches and uploads of one volume.
type volumeLocks struct{ m sync.Map } // id -> *sync.Mutex

func (l *volumeLocks) lock(id string) func() {
	mu, _ := l.m.LoadOrStore(id, &sync.Mutex{})
	mu.(*sync.Mutex).Lock()
	return mu.(*sync.Mutex).Unlock
}

// volumeKey is the blob store key of version of volume id.
func volumeKey(id string, version int64) string {
	return fmt.Sprintf("volumes/%s/%d.ext4.zst", id, version)
}

// volumeKeyVersion parses a key volumeKey made: the volume's ID and version.
func volumeKeyVersion(key string) (id string, version int64, ok bool) {
	rest, found := strings.CutPrefix(key, "volumes/")
	if !found {
		return "", 0, false
	}
	id, file, found := strings.Cut(rest, "/")
	v, found2 := strings.CutSuffix(file, ".ext4.zst")
	n, err := strconv.ParseInt(v, 10, 64)
	if !found || !found2 || err != nil {
		return "", 0, false
	}
	return id, n, true
}

// fetchVolumes brings rec's volumes onto this node at their current versions, before the
// runtime mounts them (cluster mode; the attachments are rec's already).
func (e *Edge) fetchVolumes(ctx context.Context, rec *store.Sandbox) error {
	if !e.clustered() || e.cfg.Volumes == nil {
		return nil
	}
	for i, m := range rec.Volumes {
		if err := e.fetchVolume(ctx, rec.ID, rec.VolumeIDs[i], !m.ReadOnly); err != nil {
			return fmt.Errorf("attach volume %s: %w", m.Name, err)
		}
	}
	return nil
}

func (e *Edge) fetchVolume(ctx context.Context, sandbox, id string, writer bool) error {
	defer e.volLocks.lock(id)()
	v, err := e.volCat.AttachedVolume(ctx, sandbox, id)
	if err != nil {
		return err
	}
	vols := e.cfg.Volumes
	ver, digest, ok := vols.Cached(id)
	switch {
	case ok && ver == v.Version && digest == v.Digest:
		e.log.Debug("volume image cached", "volume", id, "version", v.Version)
	case v.Version == 0:
		// Never written: an empty filesystem, made here.
		if err := vols.Remove(id); err != nil {
			return err
		}
		if err := e.makeVolumeImage(ctx, id, v.SizeBytes); err != nil {
			return err
		}
	default:
		if _, err := os.Stat(vols.Path(id)); err != nil {
			if err := e.roomForVolume(ctx, id, v.SizeBytes); err != nil {
				return err
			}
		}
		if err := vols.ClearCached(id); err != nil {
			return err
		}
		start := time.Now()
		r, err := e.cfg.Shared.Get(ctx, volumeKey(id, v.Version))
		if err != nil {
			return fmt.Errorf("download version %d: %w", v.Version, err)
		}
		defer r.Close()
		zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return err
		}
		defer zr.Close()
		if err := vols.Import(id, zr, v.Digest); err != nil {
			return fmt.Errorf("download version %d: %w", v.Version, err)
		}
		e.log.Info("volume image downloaded", "volume", id, "version", v.Version, "bytes", v.SizeBytes, "took", time.Since(start))
	}
	if err := vols.SetCached(id, v.Version, v.Digest); err != nil {
		return err
	}
	if err := e.volCat.RecordVolumeCopy(ctx, sandbox, id, v.Version); err != nil {
		e.log.Warn("record a volume's copy", "volume", id, "err", err)
	}
	if writer {
		// From here the image is this writer's, of no version until its detach uploads it.
		return vols.ClearCached(id)
	}
	return nil
}

// uploadLeftVolumes, at start, uploads the read-write volumes of rec, a sandbox that ended while
// corral was down (or whose teardown a stop cut short), before its record releases them: what
// its writer wrote is in the image. (On one node reconcileVolumes replays their journals.)
func (e *Edge) uploadLeftVolumes(ctx context.Context, rec *store.Sandbox) {
	if e.clustered() {
		e.recoverVolumes(ctx, rec)
	}
}

// uploadVolume uploads the image of volume id, which sandbox (ending now, its journal replayed)
// had attached read-write, as the volume's next version and commits it. On error the volume
// stays at its last version, and this node's image, without a version, is fetched again before
// its next use.
func (e *Edge) uploadVolume(ctx context.Context, id, sandbox string) error {
	defer e.volLocks.lock(id)()
	v, err := e.volCat.AttachedVolume(ctx, sandbox, id)
	if err != nil {
		return err
	}
	next := v.Version + 1
	start := time.Now()
	f, err := e.cfg.Volumes.Open(id)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	pr, pw := io.Pipe()
	go func() {
		zw, err := zstd.NewWriter(pw, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
		if err == nil {
			_, err = io.Copy(zw, io.TeeReader(f, h))
			if cerr := zw.Close(); err == nil {
				err = cerr
			}
		}
		pw.CloseWithError(err)
	}()
	key := volumeKey(id, next)
	err = e.cfg.Shared.Put(ctx, key, pr, -1)
	pr.CloseWithError(errors.New("upload ended"))
	if err != nil {
		return fmt.Errorf("upload version %d: %w", next, err)
	}
	digest := hex.EncodeToString(h.Sum(nil))
	if err := e.volCat.CommitVolume(ctx, sandbox, id, next, digest); err != nil {
		if derr := e.cfg.Shared.Delete(context.WithoutCancel(ctx), key); derr != nil {
			e.log.Warn("remove an uncommitted volume version", "key", key, "err", derr)
		}
		return err
	}
	if err := e.cfg.Volumes.SetCached(id, next, digest); err != nil {
		e.log.Warn("record a volume's version", "volume", id, "err", err)
	}
	if v.Version > 0 {
		if err := e.cfg.Shared.Delete(ctx, volumeKey(id, v.Version)); err != nil {
			e.log.Warn("remove a volume's previous version", "volume", id, "version", v.Version, "err", err)
		}
	}
	e.log.Info("volume image uploaded", "volume", id, "version", next, "digest", digest, "bytes", v.SizeBytes, "took", time.Since(start))
	return nil
}

// RemoveDeletedVolume removes what a cluster's deleted volume id leaves on this node and in the
// blob store: every version in the blob store, and this node's cached image (other nodes drop
// theirs at their next start). A cluster's servers delete the volume's record, then ask an edge
// to do this, since they open no blob store. It refuses (409) a volume the servers still know:
// all it can do is collect what no record names.
func (e *Edge) RemoveDeletedVolume(ctx context.Context, id string) error {
	if !store.ValidVolumeID(id) {
		return errdefs.Invalid("id", "%q is not a volume ID", id)
	}
	if !e.clustered() || e.cfg.Shared == nil || e.cfg.Volumes == nil {
		return errdefs.Invalid("id", "node %s keeps no volumes in a cluster's blob store", e.cfg.Node)
	}
	current, err := e.volCat.VolumeVersions(ctx, []string{id})
	if err != nil {
		return err
	}
	if _, ok := current[id]; ok {
		return errdefs.Conflict("volume %s still exists: only a deleted volume's blobs are removed", id)
	}
	if err := e.removeVolumeBlobs(ctx, id); err != nil {
		return fmt.Errorf("remove the blobs of deleted volume %s: %w", id, err)
	}
	if err := e.cfg.Volumes.Remove(id); err != nil {
		e.log.Warn("remove a deleted volume's cached image", "volume", id, "err", err)
	}
	e.log.Info("deleted volume's blobs removed", "volume", id)
	return nil
}

// removeVolumeBlobs removes every version of volume id from the blob store.
func (e *Edge) removeVolumeBlobs(ctx context.Context, id string) error {
	objs, err := e.cfg.Shared.List(ctx, "volumes/"+id+"/")
	if err != nil {
		return err
	}
	var errs []error
	for _, o := range objs {
		errs = append(errs, e.cfg.Shared.Delete(ctx, o.Key))
	}
	return errors.Join(errs...)
}

// reconcileClusterVolumes, at start, removes this node's cached images of volumes that were
// deleted meanwhile, and the blob store's objects of deleted volumes and of versions older than
// a volume's current one (a delete or an upload cut short). Newer ones may be an upload in
// flight elsewhere: an upload whose commit fails removes its own.
func (e *Edge) reconcileClusterVolumes(ctx context.Context) error {
	// The blobs first: an object listed before the records are read whose volume has no record
	// belongs to a deleted volume (a record is made before any of its uploads).
	objs, err := e.cfg.Shared.List(ctx, "volumes/")
	if err != nil {
		return err
	}
	ids, tmp, err := e.cfg.Volumes.List()
	if err != nil {
		return err
	}
	// Which of the volumes named here are still there, and at which version.
	asked := slices.Clone(ids)
	for _, o := range objs {
		if id, _, ok := volumeKeyVersion(o.Key); ok {
			asked = append(asked, id)
		}
	}
	slices.Sort(asked)
	current, err := e.volCat.VolumeVersions(ctx, slices.Compact(asked))
	if err != nil {
		return err
	}
	for _, o := range objs {
		id, ver, ok := volumeKeyVersion(o.Key)
		if cur, known := current[id]; !ok || (known && ver >= cur) {
			continue
		}
		if err := e.cfg.Shared.Delete(ctx, o.Key); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			e.log.Warn("remove a stale volume object", "key", o.Key, "err", err)
		}
	}
	for _, id := range ids {
		if _, known := current[id]; !known {
			e.log.Info("removing the cached image of a deleted volume", "volume", id)
			if err := e.cfg.Volumes.Remove(id); err != nil {
				e.log.Error("remove a deleted volume's image", "volume", id, "err", err)
			}
		}
	}
	for _, name := range tmp {
		if err := e.cfg.Volumes.RemoveLeftover(name); err != nil {
			e.log.Error("remove a leftover volume image", "file", name, "err", err)
		}
	}
	return nil
}
