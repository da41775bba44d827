package nodeproto

import (
	"context"
	"fmt"

	"github.com/corral-dev/corral/internal/store"
	corral "github.com/corral-dev/corral/sdk/go"
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
func (t Steps) BeginStep(ctx context.Context, sandbox string, e *corral.TrajectoryEntry) (*corral.TrajectoryEntry, error) {
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
func ownAppend(ex, e *corral.TrajectoryEntry) bool {
	return ex.StartedAt.Equal(e.StartedAt) && ex.State == e.State && ex.Kind == e.Kind && ex.CommandID == e.CommandID
}

// UpdateStep rewrites step e.Seq of sandbox's trajectory.
func (t Steps) UpdateStep(ctx context.Context, sandbox string, e *corral.TrajectoryEntry) error {
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
func (t Steps) ListSteps(ctx context.Context, sandbox string, after int64, limit int, state string) ([]corral.TrajectoryEntry, error) {
	var out ListStepsResponse
	req := ListStepsRequest{Sandbox: sandbox, After: after, Limit: min(limit, MaxListSteps), State: state}
	if err := t.s.call(ctx, PathListSteps, req, &out); err != nil {
		return nil, fmt.Errorf("read the trajectory of %s from the servers: %w", sandbox, err)
	}
	return out.Steps, nil
}
