package edge

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/runtime"
	"github.com/corral-dev/corral/internal/store"
	"github.com/corral-dev/corral/internal/trace"
)

// Pause and resume. A paused sandbox's processes are frozen and its memory pushed out to swap
// by the runtime; the record says paused. Any data-plane call resumes it first (see active); the
// reaper never counts paused time as idle, and counts it against the hard TTL unless the sandbox
// was created with pause_keeps_ttl=false, in which case resume moves the expiry later by the time
// spent paused. A paused sandbox survives a restart of corral and is re-adopted paused.

// Pause pauses a running sandbox.
func (e *Edge) Pause(ctx context.Context, id string) (*store.Sandbox, error) {
	sb, err := e.ownSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	return e.pause(ctx, sb, false)
}

// Resume resumes a paused sandbox.
func (e *Edge) Resume(ctx context.Context, id string) (*store.Sandbox, error) {
	sb, err := e.ownSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	rec, err := e.resume(ctx, sb, true)
	if err != nil {
		return nil, err
	}
	return rec, nil
}

// ownSandbox is liveSandbox for what a user does to a sandbox (pause, snapshot, TTL, network,
// data plane): the containers of fncall pools are refused, since only their pool may change them
// (a paused or frozen pool container would hang the next call).
func (e *Edge) ownSandbox(ctx context.Context, id string) (*sandbox, error) {
	sb, err := e.liveSandbox(ctx, id)
	if err == nil && sb.fncall != "" {
		return nil, errdefs.Conflict("sandbox %s is a container of fncall environment %s: run calls with POST /v1/fncall/%s; only its pool manages it", sb.id, sb.fncall, sb.fncall)
	}
	return sb, err
}

// liveSandbox returns the live sandbox id, or a not-found or conflict error naming its state.
func (e *Edge) liveSandbox(ctx context.Context, id string) (*sandbox, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if sb := e.lookup(id); sb != nil {
		return sb, nil
	}
	rec, err := e.record(ctx, id)
	if err != nil {
		return nil, err
	}
	return nil, errdefs.Conflict("sandbox %s is %s (%s)", id, rec.State, rec.Reason)
}

func (e *Edge) pause(ctx context.Context, sb *sandbox, automatic bool) (_ *store.Sandbox, err error) {
	ctx, span := trace.Start(context.WithoutCancel(ctx), trace.Pause, trace.Sandbox(sb.id), trace.Node(e.cfg.Node), trace.Bool("corral.automatic", automatic))
	defer span.End(&err)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.gone {
		return nil, errdefs.Conflict("sandbox %s stopped", sb.id)
	}
	if sb.paused.Load() {
		return nil, errdefs.Conflict("sandbox %s is already paused", sb.id)
	}
	if automatic && time.Since(time.Unix(0, sb.lastActivity.Load())) < sb.autoPause {
		// The reaper judged it idle before taking the lock; a resume or a call since made it active.
		return nil, errdefs.Conflict("sandbox %s is active again", sb.id)
	}
	rec, err := e.record(ctx, sb.id)
	if err != nil {
		return nil, err
	}
	span.Set(trace.Project(rec.Project), trace.Tier(rec.Tier))
	start := time.Now()
	// A paused microvm is a memory image: what its guest has not written to a volume is lost
	// with it if the sandbox is deleted while paused.
	e.flushVolumes(ctx, rec, sb)
	st, err := e.rt.Pause(ctx, sb.id)
	if err != nil {
		return nil, fmt.Errorf("pause sandbox %s: %w", sb.id, err)
	}
	info := pauseInfo(st)
	info.TookMs = float64(time.Since(start).Microseconds()) / 1000
	info.AutomaticPause = automatic
	rec.State, rec.PausedAt, rec.LastPause = model.StatePaused, time.Now().UTC(), &info
	rec.LastActivityAt = time.Unix(0, sb.lastActivity.Load()).UTC()
	if err := e.records.PutSandbox(ctx, rec); err != nil {
		// The store must not say running while the sandbox is frozen: thaw it again.
		e.rt.Resume(ctx, sb.id)
		return nil, err
	}
	sb.paused.Store(true)
	why := "asked"
	if automatic {
		why = "idle"
	}
	e.emit(events.Paused, rec, why)
	e.log.Info("sandbox paused", "sandbox", sb.id, "automatic", automatic, "took_ms", info.TookMs,
		"memory_returned", info.MemoryReturned, "memory_before", info.MemoryBefore)
	return rec, nil
}

// resume thaws a paused sandbox. explicit says a client asked for it by name (a conflict if it is
// not paused); otherwise it is the transparent resume of a data-plane call.
func (e *Edge) resume(ctx context.Context, sb *sandbox, explicit bool) (_ *store.Sandbox, err error) {
	ctx = context.WithoutCancel(ctx)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.gone {
		return nil, errdefs.Conflict("sandbox %s stopped", sb.id)
	}
	if !sb.paused.Load() {
		if explicit {
			return nil, errdefs.Conflict("sandbox %s is running, not paused", sb.id)
		}
		return nil, nil
	}
	// Only a real resume is a span: every data-plane call passes here.
	ctx, span := trace.Start(ctx, trace.Resume, trace.Sandbox(sb.id), trace.Node(e.cfg.Node), trace.Bool("corral.explicit", explicit))
	defer span.End(&err)
	rec, err := e.record(ctx, sb.id)
	if err != nil {
		return nil, err
	}
	span.Set(trace.Project(rec.Project), trace.Tier(rec.Tier))
	start := time.Now()
	if sb.net != nil && rec.Runtime == RuntimeGVisor {
		// The restored netstack takes the address over from the namespace again.
		if err := e.cfg.Net.Manager.Reconfigure(sb.net.slot); err != nil {
			return nil, fmt.Errorf("resume sandbox %s: %w", sb.id, err)
		}
	}
	if _, err := e.rt.Resume(ctx, sb.id); err != nil {
		return nil, fmt.Errorf("resume sandbox %s: %w", sb.id, err)
	}
	took := time.Since(start)
	if !rec.PauseKeepsTTL && !rec.PausedAt.IsZero() {
		rec.ExpiresAt = rec.ExpiresAt.Add(time.Since(rec.PausedAt))
		sb.expiresAt.Store(rec.ExpiresAt.UnixNano())
	}
	if rec.LastPause != nil {
		rec.LastPause.ResumeTookMs = float64(took.Microseconds()) / 1000
	}
	rec.State, rec.PausedAt = model.StateRunning, time.Time{}
	sb.touch() // paused time is not idle time
	rec.LastActivityAt = time.Unix(0, sb.lastActivity.Load()).UTC()
	if err := e.records.PutSandbox(ctx, rec); err != nil {
		e.log.Error("record resume", "sandbox", sb.id, "err", err)
	}
	sb.paused.Store(false)
	why := "call"
	if explicit {
		why = "asked"
	}
	e.emit(events.Resumed, rec, why)
	e.log.Info("sandbox resumed", "sandbox", sb.id, "explicit", explicit, "took_ms", float64(took.Microseconds())/1000)
	return rec, nil
}

func pauseInfo(st runtime.PauseStats) model.PauseInfo {
	return model.PauseInfo{
		MemoryBefore:   int64(st.MemoryBefore),
		MemoryAfter:    int64(st.MemoryAfter),
		MemoryReturned: int64(st.MemoryReturned),
		MemorySwapped:  int64(st.Swapped),
		NoSwap:         st.NoSwap,
	}
}

// followOutput returns a next function over command cid's events that survives the agent's
// connections being cut while the sandbox lives on (a gVisor pause checkpoints the sandbox,
// which ends every connection to its agent): it waits until the sandbox runs again and re-attaches from the last
// offset it passed on. It returns the stream's error when the sandbox is gone, the agent refuses
// the re-attach, or ctx ends. close releases the re-attached stream, if any.
func (e *Edge) followOutput(ctx context.Context, sb *sandbox, cid string, next func() (agentrpc.Event, error)) (follow func() (agentrpc.Event, error), close func()) {
	var offset int64
	var cur *agentrpc.Stream
	follow = func() (agentrpc.Event, error) {
		for {
			ev, err := next()
			if err == nil {
				offset = max(offset, ev.Offset+int64(len(ev.Data)))
				return ev, nil
			}
			if cid == "" || !errors.Is(err, errdefs.ErrUnavailable) {
				return ev, err
			}
			st, rerr := e.reattach(ctx, sb, cid, offset)
			if rerr != nil {
				return ev, err
			}
			e.log.Debug("re-attached to a command after its stream was cut", "sandbox", sb.id, "command", cid, "offset", offset)
			if cur != nil {
				cur.Close()
			}
			cur, next = st, st.Next
		}
	}
	return follow, func() {
		if cur != nil {
			cur.Close()
		}
	}
}

// reattach waits until sb runs (not paused, not being paused) and attaches to cid from offset.
func (e *Edge) reattach(ctx context.Context, sb *sandbox, cid string, offset int64) (*agentrpc.Stream, error) {
	delay := 10 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 500*time.Millisecond)
		sb.mu.Lock() // waits out a pause or resume in progress
		gone := sb.gone
		sb.mu.Unlock()
		if gone {
			return nil, errdefs.Conflict("sandbox %s stopped", sb.id)
		}
		if sb.paused.Load() {
			continue
		}
		st, err := sb.agent.Attach(ctx, cid, offset, true)
		if err == nil {
			return st, nil
		}
		if !errors.Is(err, errdefs.ErrUnavailable) {
			return nil, err
		}
	}
}
