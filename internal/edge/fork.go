package edge

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/runtime"
	"github.com/corral-dev/corral/internal/store"
	"github.com/corral-dev/corral/internal/trace"
)

// Fork. A fork makes N sandboxes (copies) that go on from a running sandbox's state at the
// moment of the fork, each diverging on its own afterwards; the source runs on after a brief
// stop. The runtime takes one image of the source (runtime.Forker; with runc's backend, on
// gVisor a checkpoint of its processes and memory plus a copy of its disk, on runc its disk
// alone; with qemu's, a microvm's memory snapshot plus a copy of its disk, or its disk alone
// with disk_only) and every copy is created from it like any sandbox (launch, with
// admission.fork).
//
// What a copy is: the source's record with a new ID, state creating, forked_from naming the
// source, the source's labels with the request's over them, the same layers, limits, TTLs (it
// expires when the source would, or the request's ttl from now), environment and egress policy, and a network slot of its own
// (so its address differs from the source's). Volumes are not copied: a source with volumes
// is refused (a read-write volume has one writer). A gVisor copy restored with processes keeps
// its source's hostname (the sandbox kernel's state); a microvm's copy is given its own, with
// its address, by its agent after the restore; a disk-only copy boots with its own.
//
// Admission is all or nothing: the N copies are checked against the node's room and the
// project's quotas together and recorded in one transaction (store.AdmitSandboxes), so a quota
// that admits fewer than N refuses the fork with nothing made. A copy that fails to start takes
// the others down with it: the fork then answers the error and no copy is left running.
//
// Refused with 409: a paused source (resume it first: a fork needs its processes running to
// checkpoint them), a stopped or failed one, a runc source without disk_only (CRIU cannot
// checkpoint Corral's runc sandboxes: docs/ARCHITECTURE.md, Fork), vm sandboxes, fncall
// containers.

// forkParallel bounds the copies started at once.
const forkParallel = 8

// Fork makes req.Count copies of the running sandbox id; see the comment above. It returns the
// copies' records, running, in order.
func (e *Edge) Fork(ctx context.Context, id string, req model.ForkRequest) (_ []*store.Sandbox, err error) {
	ctx, span := trace.Start(ctx, trace.Fork, trace.Sandbox(id), trace.Node(e.cfg.Node))
	defer span.End(&err)
	n := req.Count
	if n == 0 {
		n = 1
	}
	if n < 1 || n > model.MaxForkCount {
		return nil, errdefs.Invalid("count", "%d: want 1 to %d copies", req.Count, model.MaxForkCount)
	}
	if err := catalog.ValidateLabels(req.Labels); err != nil {
		return nil, err
	}
	var ttl time.Duration
	if req.TTL != "" {
		var err error
		if ttl, err = e.policy.TTL("ttl", req.TTL); err != nil {
			return nil, err
		}
	}
	sb, err := e.ownSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	src, err := e.record(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := forkable(src, sb, req.DiskOnly); err != nil {
		return nil, err
	}
	memory := (src.Runtime == RuntimeGVisor || src.Tier == TierMicroVM) && !req.DiskOnly
	netc, err := e.compileNetwork(src.Network)
	if err != nil {
		return nil, fmt.Errorf("fork sandbox %s: its network policy: %w", id, err)
	}
	now := time.Now().UTC()
	recs := make([]*store.Sandbox, n)
	for i := range recs {
		recs[i] = forkRecord(src, e.newID(), req.Labels, memory, now)
		recs[i].Network = apiPolicy(netc)
		if ttl > 0 {
			recs[i].ExpiresAt = now.Add(ttl)
		}
	}
	if err := e.admitForks(ctx, recs); err != nil {
		if _, ok := errors.AsType[*iam.QuotaError](err); ok {
			e.bus.Publish(events.Event{Type: events.QuotaRefused, Project: src.Project, Tier: src.Tier, Reason: err.Error()})
		}
		return nil, err
	}
	// Admitted: from here every failure ends the copies' records (failed) and leaves nothing.
	img, err := e.takeForkImage(ctx, sb, src, req.DiskOnly)
	if err != nil {
		for _, rec := range recs {
			e.emit(events.Created, rec, "fork of "+id)
			e.finish(context.WithoutCancel(ctx), rec, model.StateFailed, "error: "+err.Error())
		}
		return nil, err
	}
	defer e.rt.DropFork(img)

	errs := make([]error, n)
	sem := make(chan struct{}, forkParallel)
	var wg sync.WaitGroup
	for i, rec := range recs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			fill := map[string]int64{}
			adm := &admission{rec: rec, net: netc, fill: fill, fork: img}
			_, errs[i] = e.launch(ctx, adm, false, nil, time.Now())
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		// All or nothing: the copies that started go again.
		for i, rec := range recs {
			if errs[i] == nil {
				if derr := e.stopSandbox(context.WithoutCancel(ctx), rec, model.StateFailed, "error: another copy of its fork failed: "+err.Error()); derr != nil {
					e.log.Error("remove a copy of a failed fork", "sandbox", rec.ID, "err", derr)
				}
			}
		}
		return nil, fmt.Errorf("fork sandbox %s: %w", id, err)
	}
	for _, rec := range recs {
		e.emit(events.Forked, rec, "fork of "+id)
	}
	e.log.Info("sandbox forked", "sandbox", id, "copies", n, "memory", img.Memory,
		"source_stopped", img.Stopped.Round(time.Millisecond), "took", time.Since(now).Round(time.Millisecond))
	return recs, nil
}

// forkable says why src cannot be forked, if it cannot.
func forkable(src *store.Sandbox, sb *sandbox, diskOnly bool) error {
	switch {
	case sb.paused.Load():
		return errdefs.Conflict("sandbox %s is paused: resume it first (corral resume %s), then fork it; a fork checkpoints running processes", src.ID, src.ID)
	case src.State != model.StateRunning:
		return errdefs.Conflict("sandbox %s is %s: only a running sandbox can be forked", src.ID, src.State)
	case src.Tier == TierVM:
		return errdefs.Conflict("sandbox %s is a vm sandbox, which cannot be forked: fork microvm sandboxes, gVisor ones (runtime gvisor), or runc ones with disk_only", src.ID)
	case src.Tier != TierContainer && src.Tier != TierMicroVM:
		return errdefs.Conflict("sandbox %s is a %s sandbox, which cannot be forked", src.ID, src.Tier)
	case src.Runtime == RuntimeRunc && !diskOnly:
		return errdefs.Conflict("sandbox %s runs on runc, whose running processes Corral cannot checkpoint (CRIU cannot take a runc sandbox as Corral builds it): fork it with disk_only (--disk-only: its writable layer only, processes start afresh), or use runtime gvisor to fork running processes", src.ID)
	case len(src.Volumes) > 0:
		return errdefs.Conflict("sandbox %s has volumes, which a fork does not copy (a read-write volume has one writer): fork a sandbox without volumes", src.ID)
	}
	return nil
}

// forkRecord returns the record of a copy of src named id (see the comment at the top).
func forkRecord(src *store.Sandbox, id string, labels map[string]string, memory bool, now time.Time) *store.Sandbox {
	rec := &store.Sandbox{Sandbox: src.Sandbox, Lower: slices.Clone(src.Lower), ProjectID: src.ProjectID}
	rec.ID, rec.State, rec.Reason, rec.ForkedFrom = id, model.StateCreating, "", src.ID
	rec.Labels = maps.Clone(src.Labels)
	if len(labels) > 0 && rec.Labels == nil {
		rec.Labels = map[string]string{}
	}
	maps.Copy(rec.Labels, labels)
	rec.Env, rec.Toolkits = slices.Clone(src.Env), slices.Clone(src.Toolkits)
	// A microvm's copy is given its own hostname after its restore (runtime/qemu's fork.go); a
	// gVisor one keeps the one its restored sandbox holds.
	if (!memory || src.Tier == TierMicroVM) && src.Hostname == src.ID {
		rec.Hostname = id
	}
	rec.CreatedAt, rec.LastActivityAt = now, now
	rec.EndedAt, rec.PausedAt, rec.LastPause = time.Time{}, time.Time{}, nil
	rec.NetworkAddress, rec.Egress, rec.Volumes = "", nil, nil
	rec.Boot, rec.Accelerator = "", ""
	return rec
}

// admitForks admits recs all together: the node's room for their sum, then the store's quotas.
func (e *Edge) admitForks(ctx context.Context, recs []*store.Sandbox) error {
	if e.draining.Load() {
		return fmt.Errorf("node %s is draining (corral node uncordon %s lets it take sandboxes again): %w", e.cfg.Node, e.cfg.Node, errdefs.ErrNodeFull)
	}
	e.layersMu.RLock()
	defer e.layersMu.RUnlock()
	if e.cfg.Capacity == nil && e.cfg.Disk == nil {
		return e.admitAll(ctx, recs)
	}
	e.capMu.Lock()
	defer e.capMu.Unlock()
	sum := *recs[0]
	sum.Limits.CPUs *= float64(len(recs))
	sum.Limits.MemoryBytes *= int64(len(recs))
	sum.Limits.DiskBytes *= int64(len(recs))
	if err := e.roomLocked(&sum, len(recs)); err != nil {
		return err
	}
	return e.admitReleasing(recs, func() error { return e.admitAll(ctx, recs) })
}

// takeForkImage has the runtime take the fork image of the running sandbox sb (record src),
// holding its lock so that no pause, resume or delete runs meanwhile.
func (e *Edge) takeForkImage(ctx context.Context, sb *sandbox, src *store.Sandbox, diskOnly bool) (*runtime.ForkImage, error) {
	ctx = context.WithoutCancel(ctx) // the source must be restored whatever the client does
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.gone {
		return nil, errdefs.Conflict("sandbox %s stopped", sb.id)
	}
	if sb.paused.Load() {
		return nil, errdefs.Conflict("sandbox %s is paused: resume it first, then fork it", sb.id)
	}
	opts := runtime.ForkOptions{DiskOnly: diskOnly}
	if sb.net != nil && src.Runtime == RuntimeGVisor {
		// As for Resume: the restored netstack takes the address over from the namespace again.
		opts.BeforeRestore = func() error { return e.cfg.Net.Manager.Reconfigure(sb.net.slot) }
	}
	img, err := e.rt.Fork(ctx, sb.id, opts)
	if err != nil {
		return nil, err
	}
	sb.touch()
	return img, nil
}
