package edge

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/runtime"
	"github.com/corral-dev/corral/internal/store"
)

// Volumes on one node. A volume's record (the store) says who owns it, its size (charged to its
// project's disk quota when it is made) and which live sandboxes have it attached; its bytes are
// an ext4 image in Config.Volumes, allocated in full. A sandbox's create names volumes by name
// in its own project; the admission transaction records the attachments (one read-write, or
// any number read-only), and the runtime mounts the image: a loop mount bound in for runc and
// gVisor, a virtio-blk disk for a microvm. An attachment ends with the sandbox's record leaving
// the live states, and the runtime's teardown of the sandbox unmounts it. A paused sandbox keeps
// its attachments (runc: frozen with the mount in place; gVisor: its checkpoint restores onto
// the same mount; microvm: QEMU is gone, its disk reopened on resume).

// VolumeDir keeps a node's volume images (internal/volume implements it).
type VolumeDir interface {
	Path(id string) string
	Create(ctx context.Context, id string, size int64) error
	Remove(id string) error
	List() (ids, tmp []string, err error)
	RemoveLeftover(name string) error
	Bytes() (int64, error)
	// Recover replays a volume's journal left by a writer that did not unmount; only while
	// the volume is attached nowhere.
	Recover(ctx context.Context, id string) error
	// A cluster node's images are cached copies of versions in the blob store (volblob.go).
	Cached(id string) (version int64, digest string, ok bool)
	SetCached(id string, version int64, digest string) error
	ClearCached(id string) error
	Import(id string, r io.Reader, digest string) error
	Open(id string) (*os.File, error)
}

// Bounds of a volume's size.
const (
	MinVolumeBytes = 16 << 20
	MaxVolumeBytes = 4 << 40
)

func (e *Edge) volumesOn() error {
	if e.cfg.Volumes == nil {
		return errdefs.Invalid("volumes", "volumes are off on this node")
	}
	if e.clustered() && e.cfg.Shared == nil {
		return errdefs.Invalid("volumes", "volumes in a cluster need its blob store, and this node has none")
	}
	return nil
}

// errClusterVolumes refuses a volume's create or delete on a cluster's edge: the servers keep
// the records (internal/cluster, volumes.go), and the edges their images' copies.
var errClusterVolumes = errdefs.Invalid("volumes", "a cluster's volumes are created and deleted by its servers")

// CreateVolume makes a volume on a single-node Corral: its record (the quota checked and
// charged, the name claimed in its project), then its image. A volume whose image cannot be
// made is not left behind.
func (e *Edge) CreateVolume(ctx context.Context, req model.CreateVolumeRequest) (*store.VolumeRecord, error) {
	if err := e.volumesOn(); err != nil {
		return nil, err
	}
	if e.clustered() {
		return nil, errClusterVolumes
	}
	if err := CheckVolume(req); err != nil {
		return nil, err
	}
	p, err := e.project(ctx, req.Project)
	if err != nil {
		return nil, err
	}
	v := NewVolume(req, p, e.cfg.Node)
	if err := e.store.CreateVolume(ctx, v); err != nil {
		return nil, err
	}
	if err := e.makeVolumeImage(ctx, v.ID, v.SizeBytes); err != nil {
		if _, derr := e.store.DeleteVolume(context.WithoutCancel(ctx), v.ID); derr != nil {
			e.log.Error("remove the record of a volume that could not be made", "volume", v.ID, "err", derr)
		}
		return nil, fmt.Errorf("create volume %s: %w", req.Name, err)
	}
	if err := e.store.SetVolumeState(ctx, v.ID, store.VolumeReady); err != nil {
		return nil, err
	}
	v.State = store.VolumeReady
	e.log.Info("volume created", "volume", v.ID, "name", v.Name, "project", v.Project, "bytes", v.SizeBytes)
	return v, nil
}

// CheckVolume checks a volume's create request: its name and its size.
func CheckVolume(req model.CreateVolumeRequest) error {
	if !catalog.ValidVolumeName(req.Name) {
		return errdefs.Invalid("name", "%q: want 1-63 lowercase letters, digits, '.', '_' or '-', starting and ending with a letter or digit", req.Name)
	}
	if req.SizeBytes < MinVolumeBytes || req.SizeBytes > MaxVolumeBytes {
		return errdefs.Invalid("size_bytes", "%d is outside [%d, %d]", req.SizeBytes, int64(MinVolumeBytes), int64(MaxVolumeBytes))
	}
	return nil
}

// NewVolume is the record (state creating, a new ID) of the volume req (CheckVolume passed) asks
// for in project p, on node ("": a cluster's, in its blob store). Its size is rounded up to
// whole 4 KiB blocks: the filesystem is made of them.
func NewVolume(req model.CreateVolumeRequest, p *store.ProjectRecord, node string) *store.VolumeRecord {
	return &store.VolumeRecord{
		Volume: model.Volume{Name: req.Name, Project: iam.Display(p.Path), SizeBytes: (req.SizeBytes + 4095) &^ 4095, Node: node, CreatedAt: time.Now().UTC()},
		ID:     store.NewVolumeID(), ProjectID: p.ID, State: store.VolumeCreating,
	}
}

// Volume returns the volume name of the project at path.
func (e *Edge) Volume(ctx context.Context, project, name string) (*store.VolumeRecord, error) {
	p, err := e.project(ctx, project)
	if err != nil {
		return nil, err
	}
	return e.store.GetVolume(ctx, p.ID, name)
}

// DeleteVolume deletes a single-node Corral's volume and its image; refused (409) while a sandbox
// has it attached.
func (e *Edge) DeleteVolume(ctx context.Context, project, name string) (*store.VolumeRecord, error) {
	if e.clustered() {
		return nil, errClusterVolumes
	}
	v, err := e.Volume(ctx, project, name)
	if err != nil {
		return nil, err
	}
	if v.Node != e.cfg.Node {
		return nil, errdefs.Invalid("name", "volume %s lives on node %s, not on this one", name, v.Node)
	}
	if v, err = e.store.DeleteVolume(ctx, v.ID); err != nil {
		return nil, err
	}
	if e.cfg.Volumes != nil {
		if err := e.cfg.Volumes.Remove(v.ID); err != nil {
			// The record is gone: the next start removes the orphaned image.
			e.log.Error("remove a deleted volume's image", "volume", v.ID, "err", err)
		}
	}
	e.log.Info("volume deleted", "volume", v.ID, "name", v.Name, "project", v.Project)
	return v, nil
}

// VolumeBytes is what this node's volume images hold on its disk (for the node's disk admission).
func (e *Edge) VolumeBytes() (int64, error) {
	if e.cfg.Volumes == nil {
		return 0, nil
	}
	return e.cfg.Volumes.Bytes()
}

// reconcileVolumes, at start, finishes what a crash cut short: volumes still being made lose
// their record and image, and images no record names (a delete cut short) go.
func (e *Edge) reconcileVolumes(ctx context.Context) error {
	if e.cfg.Volumes == nil {
		return nil
	}
	if e.clustered() {
		if e.cfg.Shared == nil {
			return nil
		}
		return e.reconcileClusterVolumes(ctx)
	}
	vs, err := e.store.ListVolumes(ctx, "", e.cfg.Node)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, v := range vs {
		if v.State == store.VolumeCreating {
			e.log.Warn("volume was being made when corral stopped; removing it", "volume", v.ID, "name", v.Name)
			if _, err := e.store.DeleteVolume(ctx, v.ID); err != nil {
				e.log.Error("remove an unfinished volume", "volume", v.ID, "err", err)
				known[v.ID] = true
			}
			continue
		}
		known[v.ID] = true
		if len(v.AttachedTo) == 0 {
			// Attached nowhere: a writer a crash cut short may have left its journal unreplayed.
			if err := e.cfg.Volumes.Recover(ctx, v.ID); err != nil {
				e.log.Error("replay a volume's journal", "volume", v.ID, "err", err)
			}
		}
	}
	ids, tmp, err := e.cfg.Volumes.List()
	if err != nil {
		return err
	}
	for _, id := range ids {
		if !known[id] {
			e.log.Warn("removing a volume image no record names", "volume", id)
			if err := e.cfg.Volumes.Remove(id); err != nil {
				e.log.Error("remove an orphaned volume image", "volume", id, "err", err)
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

// recoverVolumes replays the journals of rec's read-write volumes, whose writer (rec's sandbox,
// just deleted) may have ended without unmounting them (a microvm's): until then a read-only
// mount would miss what it wrote last.
func (e *Edge) recoverVolumes(ctx context.Context, rec *store.Sandbox) {
	if e.cfg.Volumes == nil {
		return
	}
	for i, m := range rec.Volumes {
		if m.ReadOnly {
			continue
		}
		if err := e.cfg.Volumes.Recover(ctx, rec.VolumeIDs[i]); err != nil {
			e.log.Error("replay the journal of a volume its sandbox left", "sandbox", rec.ID, "volume", rec.VolumeIDs[i], "err", err)
			continue // not uploaded: the volume stays at its last version
		}
		if e.clustered() && e.cfg.Shared != nil {
			// Before the record releases the attachment: the next attach anywhere sees it.
			if err := e.uploadVolume(ctx, rec.VolumeIDs[i], rec.ID); err != nil {
				e.log.Error("upload a volume its writer left; it stays at its last version", "sandbox", rec.ID, "volume", rec.VolumeIDs[i], "err", err)
			}
		}
	}
}

// runtimeVolumes are rec's volumes as the runtime mounts them.
func (e *Edge) runtimeVolumes(rec *store.Sandbox) []runtime.Volume {
	if len(rec.Volumes) == 0 || e.cfg.Volumes == nil {
		return nil
	}
	out := make([]runtime.Volume, len(rec.Volumes))
	for i, m := range rec.Volumes {
		out[i] = runtime.Volume{Image: e.cfg.Volumes.Path(rec.VolumeIDs[i]), Path: m.Path, ReadOnly: m.ReadOnly}
	}
	return out
}

// flushVolumes has a running microvm's guest write its read-write volumes' dirty data back
// before the VM is stopped: the end of its QEMU is a power cut to the guest, which loses what
// its page cache held. (A container's writes are in the host's page cache already, and its
// volume's unmount writes them back.) Best effort and bounded: a guest that does not answer
// loses what a machine losing power would.
func (e *Edge) flushVolumes(ctx context.Context, rec *store.Sandbox, sb *sandbox) {
	if rec.Tier != TierMicroVM || sb.paused.Load() || !slices.ContainsFunc(rec.Volumes, func(m model.VolumeMount) bool { return !m.ReadOnly }) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sess, err := sb.agent.Exec(ctx, agentrpc.ExecRequest{Argv: []string{"sync"}, Timeout: 10 * time.Second})
	if err == nil {
		err = startError(sess.Info())
		defer sess.Close()
	}
	for err == nil {
		var ev agentrpc.Event
		if ev, err = sess.Next(); err == nil && ev.Type == agentrpc.EventExit {
			return
		}
	}
	e.log.Warn("flush the volumes of a microvm before it stops", "sandbox", rec.ID, "err", err)
}

// makeVolumeImage makes a volume's image once the node's disk promise has room for it: a
// volume's blocks are allocated in full, like a sandbox's disk, and counted by the same promise
// (daemon.diskHolders).
func (e *Edge) makeVolumeImage(ctx context.Context, id string, size int64) error {
	e.capMu.Lock()
	defer e.capMu.Unlock()
	if err := e.roomForVolumeLocked(ctx, id, size); err != nil {
		return err
	}
	return e.cfg.Volumes.Create(ctx, id, size)
}

// roomForVolume checks that the node's disk promise has room for a volume image of size bytes
// (a cluster node about to download one).
func (e *Edge) roomForVolume(ctx context.Context, id string, size int64) error {
	e.capMu.Lock()
	defer e.capMu.Unlock()
	return e.roomForVolumeLocked(ctx, id, size)
}

// roomForVolumeLocked is roomForVolume with e.capMu held.
func (e *Edge) roomForVolumeLocked(ctx context.Context, id string, size int64) error {
	if d, ok, err := e.DiskPromise(); err != nil {
		return err
	} else if ok && d.Promised+size > d.Have() {
		return fmt.Errorf("node %s has no room for volume %s: disk: have %s (free %s + %s its disks hold, ×%g), promised %s, asked %s; delete sandboxes or volumes, or ask for less (size_bytes): %w",
			e.cfg.Node, id, formatBytes(d.Have()), formatBytes(d.Free), formatBytes(d.Allocated), d.Overcommit,
			formatBytes(d.Promised), formatBytes(size), errdefs.ErrNodeFull)
	}
	return nil
}
