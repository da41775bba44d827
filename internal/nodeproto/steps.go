package nodeproto

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

// Records returns what records incarnation epoch's sandboxes: the servers, over the node
// channel. Its PutSandbox is the store's, so the edge uses either.
func (s *Servers) Records(epoch int64) Records { return Records{s, epoch} }

// Records sends an incarnation's sandbox records to the servers.
type Records struct {
	s     *Servers
	epoch int64
}

// PutSandbox records what became of sb, a sandbox admission recorded.
func (r Records) PutSandbox(ctx context.Context, sb *store.Sandbox) error {
	if err := r.s.call(ctx, PathSandbox, SandboxRequest{Epoch: r.epoch, Sandbox: sb}, nil); err != nil {
		return fmt.Errorf("record sandbox %s through the servers: %w", sb.ID, err)
	}
	return nil
}

// GetSandbox reads the stored record of sandbox id, one of the node's (PathGetSandbox).
func (r Records) GetSandbox(ctx context.Context, id string) (*store.Sandbox, error) {
	var sb store.Sandbox
	if err := r.s.call(ctx, PathGetSandbox, GetSandboxRequest{ID: id}, &sb); err != nil {
		return nil, fmt.Errorf("read sandbox %s through the servers: %w", id, err)
	}
	return &sb, nil
}

// Steps returns what records the trajectories of incarnation epoch's sandboxes: the servers,
// over the node channel. Its methods are the store's (BeginStep, UpdateStep, WriteSteps,
// ListSteps), so the edge uses either.
func (s *Servers) Steps(epoch int64) Steps { return Steps{s, epoch} }

// Steps sends an incarnation's trajectory writes to the servers and reads trajectories there.
type Steps struct {
	s     *Servers
	epoch int64
}

// BeginStep appends e to sandbox's trajectory and sets its sequence number; when e's step ID is
// a step's already, nothing is written and that step is returned.
func (t Steps) BeginStep(ctx context.Context, sandbox string, e *model.TrajectoryEntry) (*model.TrajectoryEntry, error) {
	res, err := t.write(ctx, []store.StepWrite{{Sandbox: sandbox, Entry: e}})
	if err != nil {
		return nil, fmt.Errorf("append to the trajectory of %s: %w", sandbox, err)
	}
	if ex := res[0].Existing; ex != nil && ownAppend(ex, e) {
		// A try whose answer broke off wrote it, and this one, at another replica, found it:
		// it is this call's step, not an earlier call's.
		e.Seq = ex.Seq
		return nil, nil
	}
	return res[0].Existing, nil
}

// ownAppend reports whether ex, found under e's step ID, is e as this edge appended it: the same
// start, to the nanosecond, and nothing recorded since.
func ownAppend(ex, e *model.TrajectoryEntry) bool {
	return ex.StartedAt.Equal(e.StartedAt) && ex.State == e.State && ex.Kind == e.Kind && ex.CommandID == e.CommandID
}

// UpdateStep rewrites step e.Seq of sandbox's trajectory.
func (t Steps) UpdateStep(ctx context.Context, sandbox string, e *model.TrajectoryEntry) error {
	if _, err := t.write(ctx, []store.StepWrite{{Sandbox: sandbox, Entry: e, Update: true}}); err != nil {
		return fmt.Errorf("update trajectory step %d of %s: %w", e.Seq, sandbox, err)
	}
	return nil
}

// WriteSteps applies writes in order, all or none, and sets the sequence number of each entry
// appended. At most MaxSteps go in one call.
func (t Steps) WriteSteps(ctx context.Context, writes []store.StepWrite) error {
	for _, w := range writes {
		if !w.Update && w.Entry.StepID != "" {
			return fmt.Errorf("step %q: a step with an ID is appended with BeginStep", w.Entry.StepID)
		}
	}
	_, err := t.write(ctx, writes)
	return err
}

func (t Steps) write(ctx context.Context, writes []store.StepWrite) ([]store.StepResult, error) {
	if len(writes) > MaxSteps {
		return nil, fmt.Errorf("%d trajectory writes: at most %d a call", len(writes), MaxSteps)
	}
	var out StepsResponse
	if err := t.s.call(ctx, PathSteps, StepsRequest{Epoch: t.epoch, Writes: writes}, &out); err != nil {
		return nil, fmt.Errorf("write %d trajectory steps through the servers: %w", len(writes), err)
	}
	if len(out.Steps) != len(writes) {
		return nil, fmt.Errorf("the servers answered %d of %d trajectory writes", len(out.Steps), len(writes))
	}
	for i, r := range out.Steps {
		if r.Existing == nil {
			writes[i].Entry.Seq = r.Seq
		}
	}
	return out.Steps, nil
}

// ListSteps returns up to limit steps of sandbox's trajectory after step after, in order; only
// those in state when it is set.
func (t Steps) ListSteps(ctx context.Context, sandbox string, after int64, limit int, state string) ([]model.TrajectoryEntry, error) {
	var out ListStepsResponse
	req := ListStepsRequest{Sandbox: sandbox, After: after, Limit: min(limit, MaxListSteps), State: state}
	if err := t.s.call(ctx, PathListSteps, req, &out); err != nil {
		return nil, fmt.Errorf("read the trajectory of %s from the servers: %w", sandbox, err)
	}
	return out.Steps, nil
}

// Volumes returns what reads and records the volumes of incarnation epoch's sandboxes: the
// servers, over the node channel (edge.VolumeCatalog).
func (s *Servers) Volumes(epoch int64) Volumes { return Volumes{s, epoch} }

// Volumes reads and records the volumes of an incarnation's sandboxes at the servers.
type Volumes struct {
	s     *Servers
	epoch int64
}

// AttachedVolume returns the size, version and digest of volume id, which sandbox has attached.
func (v Volumes) AttachedVolume(ctx context.Context, sandbox, id string) (*store.VolumeRecord, error) {
	var out VolumeResponse
	if err := v.s.call(ctx, PathVolume, VolumeRequest{Epoch: v.epoch, Sandbox: sandbox, Volume: id}, &out); err != nil {
		return nil, fmt.Errorf("read volume %s through the servers: %w", id, err)
	}
	rec := &store.VolumeRecord{ID: id, Version: out.Version, Digest: out.Digest}
	rec.SizeBytes = out.SizeBytes
	return rec, nil
}

// CommitVolume records version of volume id, with its image's digest, as written by sandbox.
func (v Volumes) CommitVolume(ctx context.Context, sandbox, id string, version int64, digest string) error {
	if err := v.s.call(ctx, PathVolumeCommit, VolumeRequest{Epoch: v.epoch, Sandbox: sandbox, Volume: id, Version: version, Digest: digest}, nil); err != nil {
		return fmt.Errorf("commit volume %s version %d through the servers: %w", id, version, err)
	}
	return nil
}

// RecordVolumeCopy records that the node holds version of volume id, fetched for sandbox.
func (v Volumes) RecordVolumeCopy(ctx context.Context, sandbox, id string, version int64) error {
	if err := v.s.call(ctx, PathVolumeCopy, VolumeRequest{Epoch: v.epoch, Sandbox: sandbox, Volume: id, Version: version}, nil); err != nil {
		return fmt.Errorf("record volume %s's copy through the servers: %w", id, err)
	}
	return nil
}

// VolumeVersions returns the current version of each volume of ids that still exists, asking
// in batches of store.MaxVolumeVersions.
func (v Volumes) VolumeVersions(ctx context.Context, ids []string) (map[string]int64, error) {
	out := make(map[string]int64, len(ids))
	for batch := range slices.Chunk(ids, store.MaxVolumeVersions) {
		var ans VolumeVersionsResponse
		if err := v.s.call(ctx, PathVolumeVersions, VolumeVersionsRequest{IDs: batch}, &ans); err != nil {
			return nil, fmt.Errorf("read volume versions through the servers: %w", err)
		}
		maps.Copy(out, ans.Versions)
	}
	return out, nil
}

// Digests returns what tells an edge's layer GC which blobs are in use: the servers, which see
// every node's sandboxes (edge.LayerUse).
func (s *Servers) Digests() Digests { return Digests{s} }

// Digests asks the servers which layer blobs are in use.
type Digests struct{ s *Servers }

// DigestsInUse returns which of digests a published version names or a live sandbox of any node
// has in its rootfs, asking in batches of MaxDigests.
func (d Digests) DigestsInUse(ctx context.Context, digests []string) (map[string]bool, error) {
	out := make(map[string]bool, len(digests))
	for batch := range slices.Chunk(digests, MaxDigests) {
		var ans DigestsInUseResponse
		if err := d.s.call(ctx, PathDigestsInUse, DigestsInUseRequest{Digests: batch}, &ans); err != nil {
			return nil, fmt.Errorf("ask the servers which layer blobs are in use: %w", err)
		}
		for _, dg := range ans.InUse {
			out[dg] = true
		}
	}
	return out, nil
}
