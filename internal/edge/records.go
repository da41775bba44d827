package edge

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

// ownRecords is the edge's copy of the records of its node's sandboxes that have not ended
// (creating, running, paused, off, deleting). While this process holds the node's lease, nothing
// else writes them: an older incarnation is fenced, and the servers fence this one before they
// fail its sandboxes (a lost node). So the copy is exact when it is loaded from the records
// reconcile adopts and then updated by every admission and every record written that the store
// (or the servers) took. Reads of an own sandbox's record and of the node's usage are answered
// from it, with no trip to the store or the servers; a record leaves it when its sandbox ended,
// and reads of an ended record go to the store.
//
// A record's project path can change under it (a project moved): the API server refreshes it
// from each request on the sandbox that names the path (Edge.NoteProject).
type ownRecords struct {
	mu   sync.Mutex
	recs map[string]*store.Sandbox // protected by mu
}

func newOwnRecords() *ownRecords { return &ownRecords{recs: map[string]*store.Sandbox{}} }

// cloneRecord returns a deep copy of rec as the store would give it back: its document's
// encoding, so every field a later release adds is copied too.
func cloneRecord(rec *store.Sandbox) *store.Sandbox {
	b, err := json.Marshal(rec)
	if err != nil {
		panic("edge: encode a sandbox record: " + err.Error()) // plain data: cannot fail
	}
	var out store.Sandbox
	if err := json.Unmarshal(b, &out); err != nil {
		panic("edge: decode a sandbox record: " + err.Error())
	}
	return &out
}

// ended reports whether a record is of a sandbox that ended (it leaves the copy).
func ended(rec *store.Sandbox) bool {
	switch rec.State {
	case model.StateCreating, model.StateRunning, model.StatePaused, model.StateOff, model.StateDeleting:
		return false
	}
	return true
}

// load replaces the copy with recs (the node's records that have not ended).
func (o *ownRecords) load(recs []*store.Sandbox) {
	m := make(map[string]*store.Sandbox, len(recs))
	for _, rec := range recs {
		if !ended(rec) {
			m[rec.ID] = cloneRecord(rec)
		}
	}
	o.mu.Lock()
	o.recs = m
	o.mu.Unlock()
}

// put takes up rec as the store now holds it (admitted or written).
func (o *ownRecords) put(rec *store.Sandbox) {
	if ended(rec) {
		o.mu.Lock()
		delete(o.recs, rec.ID)
		o.mu.Unlock()
		return
	}
	c := cloneRecord(rec)
	o.mu.Lock()
	o.recs[rec.ID] = c
	o.mu.Unlock()
}

// drop removes the record of id (one whose admission was refused).
func (o *ownRecords) drop(id string) {
	o.mu.Lock()
	delete(o.recs, id)
	o.mu.Unlock()
}

// get returns a copy of the record of id, if its sandbox has not ended.
func (o *ownRecords) get(id string) (*store.Sandbox, bool) {
	o.mu.Lock()
	rec := o.recs[id]
	o.mu.Unlock()
	if rec == nil {
		return nil, false
	}
	return cloneRecord(rec), true
}

// setProject records the current path (iam.Display form) of the project of sandbox id.
func (o *ownRecords) setProject(id, path string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if rec := o.recs[id]; rec != nil {
		rec.Project = path
	}
}

// usage sums what the node's live sandboxes use (their limits): store.NodeUsage from the copy.
func (o *ownRecords) usage() store.Resources {
	var u store.Resources
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, rec := range o.recs {
		if rec.State == model.StateDeleting {
			continue // no longer counts (it released its quota)
		}
		u.Sandboxes++
		u.CPUs += rec.Limits.CPUs
		u.MemoryBytes += rec.Limits.MemoryBytes
		u.DiskBytes += rec.Limits.DiskBytes
	}
	return u
}

// writeThrough is the edge's Records: each record written that the store (or the servers) took
// also goes to the edge's copy.
type writeThrough struct {
	Records
	own *ownRecords
}

func (w writeThrough) PutSandbox(ctx context.Context, rec *store.Sandbox) error {
	if err := w.Records.PutSandbox(ctx, rec); err != nil {
		return err
	}
	w.own.put(rec)
	return nil
}

// record returns the record of sandbox id: this node's own from the edge's copy while its
// sandbox has not ended, any other as stored (the servers answer only the node's own, on a
// cluster's edge; they route nothing about another node's sandboxes here).
func (e *Edge) record(ctx context.Context, id string) (*store.Sandbox, error) {
	if rec, ok := e.own.get(id); ok {
		return rec, nil
	}
	return e.recRead.GetSandbox(ctx, id)
}

// admitRecord records rec (state creating) through admission (quotas, idempotency: the store, or
// a cluster's servers) and takes it into the edge's copy. Callers checking the node's room run
// it through admitReleasing, so that every check from theirs on counts rec.
func (e *Edge) admitRecord(ctx context.Context, rec *store.Sandbox, key *store.Idempotency) error {
	if err := e.admissions.AdmitSandbox(ctx, rec, key); err != nil {
		e.abandonAdmission(ctx, []*store.Sandbox{rec}, err)
		return err
	}
	e.own.put(rec)
	return nil
}

// admitAll is admitRecord for records admitted together (store.AdmitSandboxes: all or none).
func (e *Edge) admitAll(ctx context.Context, recs []*store.Sandbox) error {
	if err := e.admissions.AdmitSandboxes(ctx, recs); err != nil {
		e.abandonAdmission(ctx, recs, err)
		return err
	}
	for _, rec := range recs {
		e.own.put(rec)
	}
	return nil
}

// abandonAdmission ends the records of an admission that failed as unavailable (the store's
// connection broke during the commit, or no replica answered after one may have committed):
// each may have been recorded, and nothing would make it or end it until the next start. A
// record that was never admitted is not found, which is what it should be.
func (e *Edge) abandonAdmission(ctx context.Context, recs []*store.Sandbox, err error) {
	if !errors.Is(err, errdefs.ErrUnavailable) {
		return
	}
	for _, rec := range recs {
		end := cloneRecord(rec)
		end.State, end.Reason, end.EndedAt = model.StateFailed, "error: its admission's outcome was unknown: "+err.Error(), time.Now().UTC()
		if perr := e.records.PutSandbox(context.WithoutCancel(ctx), end); perr != nil && !errors.Is(perr, errdefs.ErrNotFound) {
			e.log.Error("end the record of an admission whose outcome is unknown (the next start ends it)", "sandbox", rec.ID, "err", perr)
		}
	}
}

// admitReleasing runs admit, the admission of recs, with e.capMu (held by the caller once its
// room check passed) released for the admission's round trip to the store or the servers, so
// the node's other creates check their room meanwhile. recs are in the edge's copy from before
// the release, so every later check counts them, and leave it when admission refuses them.
// e.capMu is held again when it returns.
func (e *Edge) admitReleasing(recs []*store.Sandbox, admit func() error) error {
	for _, rec := range recs {
		e.own.put(rec)
	}
	e.capMu.Unlock()
	err := admit()
	if err != nil {
		for _, rec := range recs {
			e.own.drop(rec.ID)
		}
	}
	e.capMu.Lock()
	return err
}

// nodeUsage is what the node's live sandboxes use, from the edge's copy of their records.
func (e *Edge) nodeUsage() store.Resources { return e.own.usage() }

// NoteProject records that the project of sandbox id is now at path (canonical), as the API
// server just read it for a request on the sandbox: its record's project stays current through
// project moves.
func (e *Edge) NoteProject(id, path string) {
	e.own.setProject(id, iam.Display(path))
}
