package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/lazyregexp"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/trace"
	"golang.org/x/sys/unix"
)

// MaxUpload bounds one file or tar upload into a sandbox; the sandbox's disk limit bounds it too.
const MaxUpload = 8 << 30

// Handler returns the sandbox data plane: exec, commands and files under /v1/sandboxes/{id}/.
// Callers authenticate requests before they reach it.
func (e *Edge) Handler() http.Handler {
	mux := http.NewServeMux()
	h := &dataPlane{e: e, log: e.log}
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", h.exec)
	mux.HandleFunc("POST /v1/sandboxes/{id}/commands", h.startCommand)
	mux.HandleFunc("GET /v1/sandboxes/{id}/commands", h.listCommands)
	mux.HandleFunc("GET /v1/sandboxes/{id}/commands/{cid}", h.getCommand)
	mux.HandleFunc("GET /v1/sandboxes/{id}/commands/{cid}/output", h.output)
	mux.HandleFunc("POST /v1/sandboxes/{id}/commands/{cid}/stdin", h.stdin)
	mux.HandleFunc("POST /v1/sandboxes/{id}/commands/{cid}/signal", h.signal)
	mux.HandleFunc("POST /v1/sandboxes/{id}/commands/{cid}/resize", h.resize)
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", h.readFile)
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", h.writeFile)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/files", h.removeFile)
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/stat", h.stat)
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/list", h.list)
	mux.HandleFunc("POST /v1/sandboxes/{id}/files/mkdir", h.mkdir)
	mux.HandleFunc("POST /v1/sandboxes/{id}/files/move", h.move)
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/watch", h.watch)
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/tar", h.tarOut)
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files/tar", h.tarIn)
	mux.HandleFunc("GET /v1/sandboxes/{id}/trajectory", h.trajectory)
	mux.HandleFunc("/v1/sandboxes/{id}/ports/{port}/{path...}", h.port)
	mux.HandleFunc("GET /v1/sandboxes/{id}/screen", h.screen)
	mux.HandleFunc("POST /v1/sandboxes/{id}/input", h.input)
	mux.HandleFunc("GET /v1/sandboxes/{id}/console", h.console)
	mux.HandleFunc("GET /v1/sandboxes/{id}/vnc", h.vnc)
	h.codeRoutes(mux) // code.go
	mux.HandleFunc("GET /v1/sandboxes/{id}/metrics", h.metrics)
	return mux
}

type dataPlane struct {
	e   *Edge
	log *slog.Logger
}

func (h *dataPlane) fail(w http.ResponseWriter, r *http.Request, err error) {
	httpjson.Error(w, r, h.log.With("sandbox", r.PathValue("id")), err)
}

// sandbox returns the running sandbox named in the path, or answers with an error.
func (h *dataPlane) sandbox(w http.ResponseWriter, r *http.Request) *sandbox {
	sb, err := h.e.active(r.Context(), r.PathValue("id"))
	if err != nil {
		h.fail(w, r, err)
		return nil
	}
	sb.actions.Add(1)
	if err := h.e.observeCall(sb, r.Method, r.URL.Path, r.Header.Get(model.TokensHeader)); err != nil {
		h.fail(w, r, err)
		return nil
	}
	return sb
}

var (
	commandIDRE = lazyregexp.New(`^[A-Za-z0-9_-]{1,64}$`)
)

const maxArgvBytes = 256 << 10

// agentRequest validates an API exec request and converts it for the agent.
func (e *Edge) agentRequest(sb *sandbox, req model.ExecRequest) (agentrpc.ExecRequest, error) {
	if req.Cwd == "" {
		req.Cwd = sb.cwd
	}
	if req.User == "" {
		req.User = sb.user
	}
	out := agentrpc.ExecRequest{
		Argv: req.Argv, Shell: req.Shell, Env: req.Env, Cwd: req.Cwd, User: req.User,
		Stdin: req.Stdin, KeepStdinOpen: req.OpenStdin, TTY: req.TTY, Rows: req.Rows, Cols: req.Cols, OutputLimit: sb.outputLimit,
		Exclusive: req.Exclusive,
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return out, errdefs.Invalid("argv", "a command is required")
	}
	if req.Shell && len(req.Argv) != 1 {
		return out, errdefs.Invalid("argv", "with shell, argv must be one string (the script), got %d", len(req.Argv))
	}
	total := 0
	for i, a := range req.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return out, errdefs.Invalid(fmt.Sprintf("argv[%d]", i), "contains a NUL byte")
		}
		total += len(a)
	}
	if total > maxArgvBytes {
		return out, errdefs.Invalid("argv", "%d bytes in all, more than %d", total, maxArgvBytes)
	}
	if err := catalog.ValidateEnv("env", req.Env); err != nil {
		return out, err
	}
	if len(sb.env) > 0 {
		out.Env = append(sb.env, req.Env...) // sb.env is clipped: a fresh array
	}
	if req.Cwd != "" {
		if err := checkPath("cwd", req.Cwd); err != nil {
			return out, err
		}
	}
	if req.User != "" && !catalog.ValidUser(req.User) {
		return out, errdefs.Invalid("user", "%q is not a user name or uid[:gid]", req.User)
	}
	if req.Timeout != "" {
		d, err := time.ParseDuration(req.Timeout)
		if err != nil || d <= 0 || d > e.policy.MaxTTL() {
			return out, errdefs.Invalid("timeout", "%q must be a positive duration of at most %s", req.Timeout, e.policy.MaxTTL())
		}
		out.Timeout = d
	}
	if req.Rows > 1000 || req.Cols > 1000 {
		return out, errdefs.Invalid("rows", "terminal size %dx%d is larger than 1000x1000", req.Rows, req.Cols)
	}
	if !req.TTY && (req.Rows != 0 || req.Cols != 0) {
		return out, errdefs.Invalid("tty", "rows and cols need tty")
	}
	return out, nil
}

// checkPath validates a path inside a sandbox.
func checkPath(field, p string) error {
	switch {
	case p == "":
		return errdefs.Invalid(field, "a path is required")
	case !strings.HasPrefix(p, "/"):
		return errdefs.Invalid(field, "%q must be an absolute path", p)
	case len(p) > 4096:
		return errdefs.Invalid(field, "longer than 4096 bytes")
	case strings.IndexByte(p, 0) >= 0:
		return errdefs.Invalid(field, "contains a NUL byte")
	}
	return nil
}

// ndjson writes events as newline-delimited JSON, flushing after each.
type ndjson struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	enc *json.Encoder
}

func newNDJSON(w http.ResponseWriter) *ndjson {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	return &ndjson{w: w, rc: http.NewResponseController(w), enc: json.NewEncoder(w)}
}

func (n *ndjson) send(ev model.Event) error { return n.write(ev) }

// write sends one line of any shape and flushes it.
func (n *ndjson) write(v any) error {
	if err := n.enc.Encode(v); err != nil {
		return err
	}
	return n.rc.Flush()
}

// EventWriter writes a call's events as NDJSON. The response starts with the first event, so a
// call that fails before any output still gets a plain error response.
type EventWriter struct {
	w  http.ResponseWriter
	nd *ndjson
}

// NewEventWriter returns an EventWriter on w.
func NewEventWriter(w http.ResponseWriter) *EventWriter { return &EventWriter{w: w} }

// Send writes one event and flushes it.
func (e *EventWriter) Send(ev model.Event) error {
	if e.nd == nil {
		e.nd = newNDJSON(e.w)
	}
	return e.nd.send(ev)
}

// Started reports whether the response has begun.
func (e *EventWriter) Started() bool { return e.nd != nil }

func apiEvent(ev agentrpc.Event) model.Event {
	return model.Event{Type: ev.Type, Offset: ev.Offset, Data: ev.Data, Dropped: ev.Dropped, Exit: apiExit(ev.Exit)}
}

func apiExit(x *agentrpc.Exit) *model.Exit {
	if x == nil {
		return nil
	}
	return &model.Exit{Code: x.Code, Signal: x.Signal, TimedOut: x.TimedOut, OOMKilled: x.OOMKilled, Error: x.Error}
}

func apiCommand(c agentrpc.CommandInfo) model.Command {
	return model.Command{
		ID: c.ID, Argv: c.Argv, Pid: c.Pid, TTY: c.TTY, Exclusive: c.Exclusive, State: c.State,
		StartedAt: c.StartedAt, EndedAt: c.EndedAt, Exit: apiExit(c.Exit),
		OutputStart: c.OutputStart, OutputEnd: c.OutputEnd,
	}
}

// exec starts a command and streams its output; with ?stdin=stream the request body continues
// with the command's stdin after the JSON object and a newline. The call is appended to the
// sandbox's trajectory; a step_id makes it replayable (see trajectory.go).
func (h *dataPlane) exec(w http.ResponseWriter, r *http.Request) {
	r, span := trace.StartRequest(r, trace.Exec, trace.Sandbox(r.PathValue("id")), trace.Node(h.e.cfg.Node))
	defer span.End(nil) // failures mark it through h.fail
	sb := h.sandbox(w, r)
	if sb == nil {
		return
	}
	span.Set(trace.Project(sb.project), trace.Tier(sb.tier))
	streamStdin := r.URL.Query().Get("stdin") == "stream"
	var req model.ExecRequest
	var stdin io.Reader
	var err error
	if streamStdin {
		stdin, err = httpjson.DecodeStream(r.Body, &req)
	} else {
		err = httpjson.Decode(r, &req)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	areq, err := h.e.agentRequest(sb, req)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	ctx := context.WithoutCancel(r.Context()) // the command and its record outlive this request
	entry, existing, err := h.e.beginStep(ctx, sb, req, &areq, streamStdin)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if existing != nil {
		h.existingStep(w, r, sb, existing, entry)
		return
	}
	if streamStdin {
		areq.KeepStdinOpen = true
		if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
			h.fail(w, r, fmt.Errorf("full-duplex stdin: %w", err))
			return
		}
	}
	sess, err := sb.agent.Exec(ctx, areq)
	if err == nil {
		err = startError(sess.Info())
		if err != nil {
			sess.Close()
		}
	}
	if err != nil {
		if entry.Seq > 0 {
			h.e.finishStep(sb.id, entry, model.StepFailed, err.Error())
		}
		h.fail(w, r, err)
		return
	}
	defer sess.Close()
	h.e.recordStarted(ctx, sb, entry, sess.Info().ID)
	if streamStdin {
		// A half-read request body cannot be reused for another request on this connection.
		w.Header().Set("Connection", "close")
	}
	out := newNDJSON(w)
	clientGone := out.send(model.Event{Type: "start", CommandID: entry.CommandID, Pid: sess.Info().Pid}) != nil
	if streamStdin {
		copied := make(chan struct{})
		go func() {
			defer close(copied)
			in := sess.Stdin()
			_, err := io.Copy(in, stdin)
			in.Close()
			if err != nil {
				// The command stopped taking stdin: keep reading what the client still sends, so
				// that it is never cut off while writing and always gets the response.
				io.Copy(io.Discard, stdin)
			}
		}()
		// The request body must not be read after the handler returns: after the exit event, give
		// the client a moment to finish its body (the SDK stops at the exit event), then cut a
		// pending read short and wait for the copier.
		defer func() {
			select {
			case <-copied:
			case <-time.After(2 * time.Second):
			}
			http.NewResponseController(w).SetReadDeadline(time.Now())
			<-copied
		}()
	}
	h.record(ctx, sb, entry, out, clientGone, sess.Next)
}

// existingStep answers an exec whose step_id is in the log already: a 409 for another request,
// the recorded result for a finished step, the live command for a running one.
func (h *dataPlane) existingStep(w http.ResponseWriter, r *http.Request, sb *sandbox, existing, asked *model.TrajectoryEntry) {
	if normalJSON(existing.Request) != normalJSON(asked.Request) {
		h.fail(w, r, stepConflict(existing.StepID, existing.Seq))
		return
	}
	if existing.State != model.StepRunning {
		replayStep(w, existing)
		return
	}
	cid, err := findStepCommand(r.Context(), sb, existing)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	st, err := sb.agent.Attach(r.Context(), cid, 0, true)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer st.Close()
	out := newNDJSON(w)
	if out.send(model.Event{Type: "start", CommandID: cid}) != nil {
		return
	}
	h.stream(r.Context(), sb, out, st.Next)
}

// record forwards a command's events to the client and into its trajectory entry until the exit.
// A client that leaves does not stop the recording: the entry is completed either way.
func (h *dataPlane) record(ctx context.Context, sb *sandbox, entry *model.TrajectoryEntry, out *ndjson, clientGone bool, next func() (agentrpc.Event, error)) {
	rec := newStepRecorder(entry, DefaultStepOutputBytes)
	// The recording outlives the client (context.WithoutCancel) and survives a pause that cuts the
	// agent's connections.
	next, closeNext := h.e.followOutput(context.WithoutCancel(ctx), sb, entry.CommandID, next)
	defer closeNext()
	for {
		ev, err := next()
		if err != nil {
			h.log.Warn("command stream ended", "sandbox", sb.id, "command", entry.CommandID, "err", err)
			if !clientGone {
				out.send(model.Event{Type: "error", Data: []byte(err.Error())})
			}
			h.e.finishStep(sb.id, entry, model.StepFailed, "output stream ended: "+err.Error())
			return
		}
		sb.touch()
		if ev.Type == agentrpc.EventExit && ev.Exit != nil && ev.Exit.Signal == "SIGKILL" && !ev.Exit.TimedOut && !ev.Exit.OOMKilled {
			ev.Exit.OOMKilled = h.e.oomKilledSince(ctx, sb)
		}
		rec.add(ev)
		if !clientGone && out.send(apiEvent(ev)) != nil {
			clientGone = true
		}
		if ev.Type == agentrpc.EventExit {
			h.e.finishStep(sb.id, entry, model.StepDone, "")
			return
		}
	}
}

// startError turns a command that could not start at all (no such program, bad cwd or user) into
// an invalid-argument error naming the field, so the caller gets a 400 instead of a stream.
func startError(c agentrpc.CommandInfo) error {
	x := c.Exit
	if x == nil || x.Error == "" {
		return nil
	}
	switch {
	case x.Code == 127:
		return errdefs.Invalid("argv", "%s", x.Error)
	case strings.HasPrefix(x.Error, "cwd"):
		return errdefs.Invalid("cwd", "%s", strings.TrimPrefix(x.Error, "cwd "))
	case strings.HasPrefix(x.Error, "user"):
		return errdefs.Invalid("user", "%s", strings.TrimPrefix(x.Error, "user: "))
	}
	// Anything else (not executable, out of processes) is the command's result: exit 126 with
	// the reason, delivered in the stream.
	return nil
}

// stream forwards agent events until the exit event, an error, or the client leaving.
func (h *dataPlane) stream(ctx context.Context, sb *sandbox, out *ndjson, next func() (agentrpc.Event, error)) {
	for {
		ev, err := next()
		if err != nil {
			if err != io.EOF && ctx.Err() == nil {
				h.log.Warn("command stream ended", "sandbox", sb.id, "err", err)
				out.send(model.Event{Type: "error", Data: []byte(err.Error())})
			}
			return
		}
		sb.touch()
		if ev.Type == agentrpc.EventExit && ev.Exit != nil && ev.Exit.Signal == "SIGKILL" && !ev.Exit.TimedOut && !ev.Exit.OOMKilled {
			ev.Exit.OOMKilled = h.e.oomKilledSince(ctx, sb)
		}
		if err := out.send(apiEvent(ev)); err != nil {
			return
		}
		if ev.Type == agentrpc.EventExit {
			return
		}
	}
}

func (h *dataPlane) startCommand(w http.ResponseWriter, r *http.Request) {
	r, span := trace.StartRequest(r, trace.CommandNew, trace.Sandbox(r.PathValue("id")), trace.Node(h.e.cfg.Node))
	defer span.End(nil) // failures mark it through h.fail
	sb := h.sandbox(w, r)
	if sb == nil {
		return
	}
	span.Set(trace.Project(sb.project), trace.Tier(sb.tier))
	var req model.ExecRequest
	if err := httpjson.Decode(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	areq, err := h.e.agentRequest(sb, req)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	ctx := context.WithoutCancel(r.Context())
	entry, existing, err := h.e.beginStep(ctx, sb, req, &areq, false)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if existing != nil {
		if normalJSON(existing.Request) != normalJSON(entry.Request) {
			h.fail(w, r, stepConflict(existing.StepID, existing.Seq))
			return
		}
		cmd := model.Command{ID: existing.CommandID, State: agentrpc.CommandExited, StartedAt: existing.StartedAt, EndedAt: existing.EndedAt, Exit: existing.Exit}
		if existing.State == model.StepRunning {
			cid, err := findStepCommand(r.Context(), sb, existing)
			if err == nil {
				var info agentrpc.CommandInfo
				if info, err = sb.agent.Command(r.Context(), cid); err == nil {
					cmd = apiCommand(info)
				}
			}
			if err != nil {
				h.fail(w, r, err)
				return
			}
		}
		httpjson.Write(w, http.StatusOK, cmd)
		return
	}
	info, err := sb.agent.Start(ctx, areq)
	if err == nil {
		err = startError(info)
	}
	if err != nil {
		if entry.Seq > 0 {
			h.e.finishStep(sb.id, entry, model.StepFailed, err.Error())
		}
		h.fail(w, r, err)
		return
	}
	if h.e.recordStarted(ctx, sb, entry, info.ID) {
		go h.e.followStep(sb, entry)
	}
	httpjson.Write(w, http.StatusCreated, apiCommand(info))
}

func (h *dataPlane) listCommands(w http.ResponseWriter, r *http.Request) {
	sb := h.sandbox(w, r)
	if sb == nil {
		return
	}
	cmds, err := sb.agent.Commands(r.Context())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := make([]model.Command, 0, len(cmds))
	for _, c := range cmds {
		out = append(out, apiCommand(c))
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"commands": out})
}

// command returns the sandbox and the validated command ID of the path.
func (h *dataPlane) command(w http.ResponseWriter, r *http.Request) (*sandbox, string) {
	sb := h.sandbox(w, r)
	if sb == nil {
		return nil, ""
	}
	cid := r.PathValue("cid")
	if !commandIDRE.MatchString(cid) {
		h.fail(w, r, errdefs.Invalid("command_id", "%q is not a command ID", cid))
		return nil, ""
	}
	return sb, cid
}

func (h *dataPlane) getCommand(w http.ResponseWriter, r *http.Request) {
	sb, cid := h.command(w, r)
	if sb == nil {
		return
	}
	info, err := sb.agent.Command(r.Context(), cid)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, apiCommand(info))
}

func (h *dataPlane) output(w http.ResponseWriter, r *http.Request) {
	sb, cid := h.command(w, r)
	if sb == nil {
		return
	}
	q := r.URL.Query()
	var offset int64
	if s := q.Get("offset"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 0 {
			h.fail(w, r, errdefs.Invalid("offset", "%q must be a non-negative integer", s))
			return
		}
		offset = v
	}
	follow := true
	if s := q.Get("follow"); s != "" {
		v, err := strconv.ParseBool(s)
		if err != nil {
			h.fail(w, r, errdefs.Invalid("follow", "%q must be true or false", s))
			return
		}
		follow = v
	}
	st, err := sb.agent.Attach(r.Context(), cid, offset, follow)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer st.Close()
	h.stream(r.Context(), sb, newNDJSON(w), st.Next)
}

func (h *dataPlane) stdin(w http.ResponseWriter, r *http.Request) {
	sb, cid := h.command(w, r)
	if sb == nil {
		return
	}
	eof := false
	if s := r.URL.Query().Get("eof"); s != "" {
		v, err := strconv.ParseBool(s)
		if err != nil {
			h.fail(w, r, errdefs.Invalid("eof", "%q must be true or false", s))
			return
		}
		eof = v
	}
	if err := sb.agent.WriteStdin(r.Context(), cid, http.MaxBytesReader(w, r.Body, MaxUpload), eof); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// ParseSignal accepts "SIGTERM", "TERM" or a number between 1 and 64.
func ParseSignal(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > 64 {
			return 0, errdefs.Invalid("signal", "%d is not a signal number (1-64)", n)
		}
		return syscall.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, errdefs.Invalid("signal", "%q is not a signal name", s)
}

func (h *dataPlane) signal(w http.ResponseWriter, r *http.Request) {
	sb, cid := h.command(w, r)
	if sb == nil {
		return
	}
	var req model.SignalRequest
	if err := httpjson.Decode(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	sig, err := ParseSignal(req.Signal)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if err := sb.agent.Signal(r.Context(), cid, sig); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *dataPlane) resize(w http.ResponseWriter, r *http.Request) {
	sb, cid := h.command(w, r)
	if sb == nil {
		return
	}
	var req model.ResizeRequest
	if err := httpjson.Decode(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	if req.Rows == 0 || req.Cols == 0 || req.Rows > 1000 || req.Cols > 1000 {
		h.fail(w, r, errdefs.Invalid("rows", "terminal size %dx%d must be between 1x1 and 1000x1000", req.Rows, req.Cols))
		return
	}
	if err := sb.agent.Resize(r.Context(), cid, req.Rows, req.Cols); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pathParam returns the validated ?path= of the request.
func (h *dataPlane) pathParam(w http.ResponseWriter, r *http.Request) (*sandbox, string) {
	p := r.URL.Query().Get("path")
	if err := checkPath("path", p); err != nil {
		h.fail(w, r, err)
		return nil, ""
	}
	sb := h.sandbox(w, r)
	if sb == nil {
		return nil, ""
	}
	return sb, p
}

func (h *dataPlane) readFile(w http.ResponseWriter, r *http.Request) {
	sb, p := h.pathParam(w, r)
	if sb == nil {
		return
	}
	rc, info, err := sb.agent.ReadFile(r.Context(), p)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(info.Size, 10))
	w.Header().Set("X-Corral-File-Mode", fmt.Sprintf("%#o", info.Mode.Perm()))
	w.WriteHeader(http.StatusOK)
	io.Copy(w, rc)
}

// writeOptions parses ?mode=, ?user=, ?parents= and ?append=.
func writeOptions(r *http.Request, defMode fs.FileMode) (agentrpc.WriteOptions, error) {
	q := r.URL.Query()
	opts := agentrpc.WriteOptions{Mode: defMode, User: q.Get("user")}
	if s := q.Get("mode"); s != "" {
		m, err := strconv.ParseUint(s, 8, 32)
		if err != nil || m > 0o7777 {
			return opts, errdefs.Invalid("mode", "%q is not an octal file mode (e.g. 0644)", s)
		}
		opts.Mode = fs.FileMode(m & 0o777)
		if m&0o4000 != 0 {
			opts.Mode |= fs.ModeSetuid
		}
		if m&0o2000 != 0 {
			opts.Mode |= fs.ModeSetgid
		}
		if m&0o1000 != 0 {
			opts.Mode |= fs.ModeSticky
		}
	}
	if opts.User != "" && !catalog.ValidUser(opts.User) {
		return opts, errdefs.Invalid("user", "%q is not a user name or uid[:gid]", opts.User)
	}
	for _, b := range []struct {
		name string
		v    *bool
	}{{"parents", &opts.Parents}, {"append", &opts.Append}} {
		if s := q.Get(b.name); s != "" {
			v, err := strconv.ParseBool(s)
			if err != nil {
				return opts, errdefs.Invalid(b.name, "%q must be true or false", s)
			}
			*b.v = v
		}
	}
	return opts, nil
}

func (h *dataPlane) writeFile(w http.ResponseWriter, r *http.Request) {
	sb, p := h.pathParam(w, r)
	if sb == nil {
		return
	}
	opts, err := writeOptions(r, 0o644)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	started := time.Now().UTC()
	body := newHashingReader(http.MaxBytesReader(w, r.Body, MaxUpload))
	info, err := sb.agent.WriteFile(r.Context(), p, body, opts)
	h.e.recordFileCall(sb, "write_file", map[string]any{
		"path": p, "mode": fmt.Sprintf("%#o", opts.Mode.Perm()), "user": opts.User, "append": opts.Append,
		"parents": opts.Parents, "bytes": body.n, "sha256": body.sum(),
	}, err, started)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, model.FileInfo(info))
}

func (h *dataPlane) removeFile(w http.ResponseWriter, r *http.Request) {
	sb, p := h.pathParam(w, r)
	if sb == nil {
		return
	}
	if p == "/" {
		h.fail(w, r, errdefs.Invalid("path", "refusing to remove /"))
		return
	}
	recursive, _ := strconv.ParseBool(r.URL.Query().Get("recursive"))
	started := time.Now().UTC()
	err := sb.agent.Remove(r.Context(), p, recursive)
	h.e.recordFileCall(sb, "remove", map[string]any{"path": p, "recursive": recursive}, err, started)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *dataPlane) stat(w http.ResponseWriter, r *http.Request) {
	sb, p := h.pathParam(w, r)
	if sb == nil {
		return
	}
	info, err := sb.agent.Stat(r.Context(), p)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, model.FileInfo(info))
}

func (h *dataPlane) list(w http.ResponseWriter, r *http.Request) {
	sb, p := h.pathParam(w, r)
	if sb == nil {
		return
	}
	infos, err := sb.agent.List(r.Context(), p)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := make([]model.FileInfo, 0, len(infos))
	for _, fi := range infos {
		out = append(out, model.FileInfo(fi))
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"files": out})
}

func (h *dataPlane) mkdir(w http.ResponseWriter, r *http.Request) {
	sb := h.sandbox(w, r)
	if sb == nil {
		return
	}
	var req model.MkdirRequest
	if err := httpjson.Decode(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	if err := checkPath("path", req.Path); err != nil {
		h.fail(w, r, err)
		return
	}
	if req.Mode&^(fs.ModePerm|fs.ModeSetgid|fs.ModeSticky) != 0 {
		h.fail(w, r, errdefs.Invalid("mode", "%v is not a directory permission", req.Mode))
		return
	}
	if req.User != "" && !catalog.ValidUser(req.User) {
		h.fail(w, r, errdefs.Invalid("user", "%q is not a user name or uid[:gid]", req.User))
		return
	}
	mode := req.Mode
	if mode == 0 {
		mode = 0o755
	}
	started := time.Now().UTC()
	info, err := sb.agent.Mkdir(r.Context(), req.Path, agentrpc.WriteOptions{Mode: mode, User: req.User, Parents: req.Parents})
	h.e.recordFileCall(sb, "mkdir", req, err, started)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, model.FileInfo(info))
}

// move renames a file or directory inside the sandbox (rename(2): same filesystem, a file at the
// destination replaced) and answers the destination's description.
func (h *dataPlane) move(w http.ResponseWriter, r *http.Request) {
	sb := h.sandbox(w, r)
	if sb == nil {
		return
	}
	var req model.MoveRequest
	if err := httpjson.Decode(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	for _, f := range []struct{ name, path string }{{"source", req.Source}, {"destination", req.Destination}} {
		if err := checkPath(f.name, f.path); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	started := time.Now().UTC()
	info, err := sb.agent.Move(r.Context(), req.Source, req.Destination)
	h.e.recordFileCall(sb, "move", req, err, started)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, model.FileInfo(info))
}

// watchError is the last line of a watch stream that the agent ended with an error.
type watchError struct {
	Type    string `json:"type"` // "error"
	Code    string `json:"code"`
	Message string `json:"message"`
}

// watch streams the changes under a directory as NDJSON: a start line once the watch is in place
// (changes after it are all reported), then a line per change, flushed each, until the directory
// goes away (its remove or rename, then the end of the response), the agent ends the watch (an
// error line) or the client leaves. The agent bounds what it queues for a slow client and says
// what it dropped with an overflow line; this handler holds one batch at a time.
//
// Opening a watch is activity for the idle TTL, like any data-plane call; an open watch is not:
// its events are the sandbox's doing, not the client's, and a watch left open must not keep a
// forgotten sandbox alive. When such a sandbox idles out (or is deleted), its agent is gone and the
// stream ends with an error line.
func (h *dataPlane) watch(w http.ResponseWriter, r *http.Request) {
	sb, p := h.pathParam(w, r)
	if sb == nil {
		return
	}
	recursive := false
	if s := r.URL.Query().Get("recursive"); s != "" {
		v, err := strconv.ParseBool(s)
		if err != nil {
			h.fail(w, r, errdefs.Invalid("recursive", "%q must be true or false", s))
			return
		}
		recursive = v
	}
	wt, err := sb.agent.Watch(r.Context(), p, recursive)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer wt.Close()
	out := newNDJSON(w)
	if out.write(model.WatchEvent{Type: model.WatchStart}) != nil {
		return
	}
	for {
		ev, err := wt.Next()
		if err != nil {
			if err != io.EOF && r.Context().Err() == nil {
				h.log.Info("watch ended", "sandbox", sb.id, "path", p, "err", err)
				out.write(watchError{Type: "error", Code: errdefs.Code(err), Message: err.Error()})
			}
			return
		}
		if out.write(model.WatchEvent(ev)) != nil {
			return
		}
	}
}

func (h *dataPlane) tarOut(w http.ResponseWriter, r *http.Request) {
	sb, p := h.pathParam(w, r)
	if sb == nil {
		return
	}
	rc, err := sb.agent.TarOut(r.Context(), p)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/x-tar")
	w.WriteHeader(http.StatusOK)
	io.Copy(w, rc)
}

func (h *dataPlane) tarIn(w http.ResponseWriter, r *http.Request) {
	sb, p := h.pathParam(w, r)
	if sb == nil {
		return
	}
	opts, err := writeOptions(r, 0o755)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if r.URL.Query().Get("parents") == "" {
		opts.Parents = true // a tar upload creates its destination unless told not to
	}
	started := time.Now().UTC()
	body := newHashingReader(http.MaxBytesReader(w, r.Body, MaxUpload))
	err = sb.agent.TarIn(r.Context(), p, body, opts)
	h.e.recordFileCall(sb, "tar_in", map[string]any{"path": p, "user": opts.User, "bytes": body.n, "sha256": body.sum()}, err, started)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
