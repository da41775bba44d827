package edge

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lazyregexp"
	"github.com/corral-dev/corral/internal/model"
)

// The trajectory log: every exec and file-changing call made through the API is appended, in
// order, to its sandbox's log in the store. An exec with a step_id is recorded before it runs, so a
// retry after any failure (client, network, corral itself) finds it: completed steps are replayed
// from the log, running ones are attached to, and nothing runs twice.

var stepIDRE = lazyregexp.New(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$`)

// DefaultStepOutputBytes caps the output kept in the trajectory per step.
const DefaultStepOutputBytes = 256 << 10

// recordedExec is what the trajectory keeps of an exec request: stdin is represented by its
// size and hash, so the log stays small and a replayed request can still be compared.
type recordedExec struct {
	model.ExecRequest
	Stdin       []byte `json:"stdin,omitempty"`
	StdinBytes  int    `json:"stdin_bytes,omitempty"`
	StdinSHA256 string `json:"stdin_sha256,omitempty"`
	StdinStream bool   `json:"stdin_stream,omitempty"`
}

func execRecord(req model.ExecRequest, streamStdin bool) recordedExec {
	rec := recordedExec{ExecRequest: req, StdinStream: streamStdin}
	if len(req.Stdin) > 0 {
		sum := sha256.Sum256(req.Stdin)
		rec.StdinBytes, rec.StdinSHA256 = len(req.Stdin), hex.EncodeToString(sum[:])
	}
	rec.ExecRequest.Stdin = nil
	return rec
}

// normalJSON returns v as JSON with object keys sorted, so two requests compare by content.
func normalJSON(v any) string {
	b, _ := json.Marshal(v)
	var generic any
	json.Unmarshal(b, &generic)
	b, _ = json.Marshal(generic)
	return string(b)
}

// beginStep makes the trajectory entry of an exec request. With a step ID it validates it, tags
// the command with it and records the entry before anything runs, returning the existing step
// instead when the ID is taken; without one, the entry is written once the command started.
func (e *Edge) beginStep(ctx context.Context, sb *sandbox, req model.ExecRequest, areq *agentrpc.ExecRequest, streamStdin bool) (entry, existing *model.TrajectoryEntry, err error) {
	entry = &model.TrajectoryEntry{
		StepID: req.StepID, Kind: "exec", Request: execRecord(req, streamStdin),
		State: model.StepRunning, StartedAt: time.Now().UTC(), Exclusive: req.Exclusive,
	}
	if req.StepID == "" {
		return entry, nil, nil
	}
	if !stepIDRE.MatchString(req.StepID) {
		return nil, nil, errdefs.Invalid("step_id", "%q must be 1-128 letters, digits or . _ : / -", req.StepID)
	}
	areq.Tag = req.StepID
	if !e.trajectoryRoom() {
		return nil, nil, fmt.Errorf("record step %q: the node's data dir is full, so the step could not be recorded and was not run; retry later: %w", req.StepID, errdefs.ErrExhausted)
	}
	// Recorded before it runs: a retry after any crash finds it and never runs it twice.
	existing, err = e.appendStep(ctx, sb.id, entry)
	if err != nil {
		return nil, nil, err
	}
	return entry, existing, nil
}

// recordStarted records the command ID of a started step (appending the entry if beginStep did
// not); it reports whether the entry is in the store.
func (e *Edge) recordStarted(ctx context.Context, sb *sandbox, entry *model.TrajectoryEntry, commandID string) bool {
	entry.CommandID = commandID
	var err error
	if entry.Seq == 0 && !e.trajectoryRoom() {
		e.log.Warn("trajectory step not recorded: the data dir is full", "sandbox", sb.id)
		return false
	}
	if entry.StepID == "" && entry.Seq == 0 {
		// A log line, not a step a retry must find: written off the exec's path (steplog.go).
		e.queueStepBegin(sb.id, entry)
		return true
	}
	if entry.Seq > 0 {
		err = e.traj.UpdateStep(ctx, sb.id, entry)
	} else {
		_, err = e.appendStep(ctx, sb.id, entry)
	}
	if err != nil {
		e.log.Error("record trajectory step", "sandbox", sb.id, "err", err)
		return false
	}
	return true
}

// stepRecorder collects a command's output for its trajectory entry, up to a cap.
type stepRecorder struct {
	entry *model.TrajectoryEntry
	left  int
}

func newStepRecorder(entry *model.TrajectoryEntry, limit int) *stepRecorder {
	return &stepRecorder{entry: entry, left: limit}
}

func (r *stepRecorder) add(ev agentrpc.Event) {
	switch ev.Type {
	case agentrpc.EventStdout, agentrpc.EventStderr:
		if len(ev.Data) > r.left {
			r.entry.OutputTruncated = true
			if r.left == 0 {
				return
			}
			ev.Data = ev.Data[:r.left]
		}
		r.left -= len(ev.Data)
		r.entry.Output = append(r.entry.Output, model.Event{Type: ev.Type, Offset: ev.Offset, Data: ev.Data})
	case agentrpc.EventTruncated:
		r.entry.OutputTruncated = true
	case agentrpc.EventExit:
		r.entry.Exit = apiExit(ev.Exit)
	}
}

// finish records the end of a step.
func (e *Edge) finishStep(sandbox string, entry *model.TrajectoryEntry, state, errMsg string) {
	entry.State, entry.Error, entry.EndedAt = state, errMsg, time.Now().UTC()
	if !e.trajectoryRoom() && len(entry.Output) > 0 {
		// The step's end is recorded, its output is not: the disk kept for deletes stays free.
		entry.Output, entry.OutputTruncated = nil, true
	}
	if entry.StepID == "" && entry.Seq == 0 {
		e.queueStepUpdate(sandbox, entry)
		return
	}
	if err := e.traj.UpdateStep(context.Background(), sandbox, entry); err != nil {
		e.log.Error("record trajectory step", "sandbox", sandbox, "seq", entry.Seq, "err", err)
	}
}

// replayStep answers an exec whose step_id already completed, from the log alone.
func replayStep(w http.ResponseWriter, entry *model.TrajectoryEntry) {
	out := newNDJSON(w)
	if out.send(model.Event{Type: "start", CommandID: entry.CommandID, Replayed: true}) != nil {
		return
	}
	for _, ev := range entry.Output {
		if out.send(ev) != nil {
			return
		}
	}
	if entry.OutputTruncated || entry.OutputDropped {
		out.send(model.Event{Type: "truncated"})
	}
	exit := entry.Exit
	if exit == nil {
		exit = &model.Exit{Code: -1, Error: entry.Error}
	}
	out.send(model.Event{Type: "exit", Exit: exit})
}

// findStepCommand returns the agent command of a running step: by its recorded ID, or by the
// step ID the agent keeps as the command's tag (when corral stopped between starting the command
// and recording its ID).
func findStepCommand(ctx context.Context, sb *sandbox, entry *model.TrajectoryEntry) (string, error) {
	if entry.CommandID != "" {
		return entry.CommandID, nil
	}
	cmds, err := sb.agent.Commands(ctx)
	if err != nil {
		return "", err
	}
	for _, c := range cmds {
		if c.Tag == entry.StepID {
			return c.ID, nil
		}
	}
	return "", errdefs.Conflict("step %q (seq %d) was interrupted before its command started or after the sandbox forgot it; its result is unknown and it will not be run again", entry.StepID, entry.Seq)
}

// resumeRecording follows the running steps of a re-adopted sandbox to their end, so the log
// completes even though the process that started them is gone.
func (e *Edge) resumeRecording(sb *sandbox) {
	steps, err := e.traj.ListSteps(context.Background(), sb.id, 0, 1000, model.StepRunning)
	if err != nil {
		e.log.Error("read running steps", "sandbox", sb.id, "err", err)
		return
	}
	for i := range steps {
		go e.followStep(sb, &steps[i])
	}
}

// followStep attaches to a running step's command from its first byte and records it to its end.
// It is the recorder of background commands and of steps that outlived a restart.
func (e *Edge) followStep(sb *sandbox, entry *model.TrajectoryEntry) {
	ctx := context.Background()
	cid, err := findStepCommand(ctx, sb, entry)
	if err != nil {
		e.finishStep(sb.id, entry, model.StepFailed, err.Error())
		return
	}
	entry.CommandID = cid
	st, err := sb.agent.Attach(ctx, cid, 0, true)
	if err != nil {
		e.finishStep(sb.id, entry, model.StepFailed, "attach: "+err.Error())
		return
	}
	next, closeNext := e.followOutput(ctx, sb, cid, st.Next)
	entry.Output, entry.OutputTruncated = nil, false
	rec := newStepRecorder(entry, DefaultStepOutputBytes)
	for {
		ev, err := next()
		if err != nil {
			closeNext()
			st.Close()
			e.finishStep(sb.id, entry, model.StepFailed, "output stream ended: "+err.Error())
			return
		}
		rec.add(ev)
		if ev.Type == agentrpc.EventExit {
			closeNext()
			st.Close()
			e.finishStep(sb.id, entry, model.StepDone, "")
			return
		}
		if rec.left == 0 {
			// The log keeps no more of its output: stop reading it (a command printing without
			// end would otherwise cost this process CPU and memory for as long as it runs) and
			// only wait for its end.
			closeNext()
			st.Close()
			entry.OutputTruncated = true
			e.waitStepExit(sb, entry, cid)
			return
		}
	}
}

// waitStepExit polls a command whose output the log no longer takes until it ends, and records
// its exit. It stops with the edge (a restart picks the step up again) or the sandbox.
func (e *Edge) waitStepExit(sb *sandbox, entry *model.TrajectoryEntry, cid string) {
	delay := 100 * time.Millisecond
	for {
		select {
		case <-e.stop:
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
		if e.lookup(sb.id) != sb {
			e.finishStep(sb.id, entry, model.StepFailed, "the sandbox ended while the command ran")
			return
		}
		if sb.paused.Load() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := sb.agent.Command(ctx, cid)
		cancel()
		switch {
		case errors.Is(err, errdefs.ErrNotFound):
			e.finishStep(sb.id, entry, model.StepFailed, "the sandbox forgot the command before its end was recorded")
			return
		case err != nil || info.State == agentrpc.CommandRunning:
			continue
		}
		entry.Exit = apiExit(info.Exit)
		e.finishStep(sb.id, entry, model.StepDone, "")
		return
	}
}

// recordFileCall appends a completed file-changing call to the trajectory.
func (e *Edge) recordFileCall(sb *sandbox, kind string, request any, callErr error, started time.Time) {
	entry := &model.TrajectoryEntry{Kind: kind, Request: request, State: model.StepDone, StartedAt: started, EndedAt: time.Now().UTC()}
	if callErr != nil {
		entry.State, entry.Error = model.StepFailed, callErr.Error()
	}
	if !e.trajectoryRoom() {
		e.log.Warn("trajectory step not recorded: the data dir is full", "sandbox", sb.id, "kind", kind)
		return
	}
	if _, err := e.appendStep(context.Background(), sb.id, entry); err != nil {
		e.log.Error("record trajectory step", "sandbox", sb.id, "kind", kind, "err", err)
	}
}

// appendStep appends entry to sandbox's trajectory at once, after the entries still queued
// (steplog.go), so the log keeps the order in which the calls returned.
func (e *Edge) appendStep(ctx context.Context, sandbox string, entry *model.TrajectoryEntry) (*model.TrajectoryEntry, error) {
	e.flushPendingSteps(ctx)
	return e.traj.BeginStep(ctx, sandbox, entry)
}

// trajectoryRoom reports whether the data dir's filesystem has room for trajectory records:
// more free space than DiskConfig.Keep, which is kept for recording sandboxes' ends and deletes.
func (e *Edge) trajectoryRoom() bool {
	c := e.cfg.Disk
	if c == nil || c.Keep == 0 {
		return true
	}
	var fs unix.Statfs_t
	return unix.Statfs(c.Dir, &fs) != nil || int64(fs.Bavail)*fs.Bsize > c.Keep
}

// hashingReader counts and hashes what passes through it.
type hashingReader struct {
	r io.Reader
	h hash.Hash
	n int64
}

func newHashingReader(r io.Reader) *hashingReader { return &hashingReader{r: r, h: sha256.New()} }

func (h *hashingReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	h.n += int64(n)
	h.h.Write(p[:n])
	return n, err
}

func (h *hashingReader) sum() string { return hex.EncodeToString(h.h.Sum(nil)) }

// trajectory exports a sandbox's log as NDJSON: GET /v1/sandboxes/{id}/trajectory?after=SEQ.
// It works for stopped sandboxes too, until their record is forgotten.
func (h *dataPlane) trajectory(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := checkID(id); err != nil {
		h.fail(w, r, err)
		return
	}
	if _, err := h.e.record(r.Context(), id); err != nil {
		h.fail(w, r, err)
		return
	}
	var after int64
	if s := r.URL.Query().Get("after"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 0 {
			h.fail(w, r, errdefs.Invalid("after", "%q must be a non-negative integer", s))
			return
		}
		after = v
	}
	// Every exec that has returned to its client is in the log.
	h.e.flushSteps(r.Context())
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	wrote := false
	for {
		steps, err := h.e.traj.ListSteps(r.Context(), id, after, 500, "")
		if err != nil {
			if !wrote {
				h.fail(w, r, err)
			}
			return
		}
		for i := range steps {
			if err := enc.Encode(&steps[i]); err != nil {
				return
			}
			wrote = true
			after = steps[i].Seq
		}
		if len(steps) < 500 {
			if !wrote {
				w.WriteHeader(http.StatusOK)
			}
			return
		}
	}
}

// stepConflict is the error for a step_id reused with another request.
func stepConflict(stepID string, seq int64) error {
	return errdefs.Conflict("step_id %q was already used (step %d) for a different request; use a new step_id", stepID, seq)
}
