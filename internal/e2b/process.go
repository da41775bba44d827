package e2b

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// envd's process.Process service (docs/e2b-protocol.md §5) served over Corral's background
// commands. Every E2B process is a Corral command started with POST /commands; its E2B pid is
// the command's pid, looked up among the sandbox's running commands on each call, so the
// gateway keeps nothing per process and any gateway can serve any call.
//
//	Method       Corral calls                       Notes
//	Start        [stat /bin/bash], [read            stream: start{pid}, data, keepalive, end. The
//	             /etc/passwd], POST exec (one       process outlives the stream; Connect-Timeout-Ms
//	             streaming call; its start event    is the command's timeout (absent: none).
//	             carries the pid)
//	Connect      GET commands, GET output from      stream: start{pid}, then live output only.
//	             its current end (follow)
//	List         GET commands                       running commands: config{cmd, args}, pid.
//	SendInput    GET commands, POST stdin           input.stdin into a pipe, input.pty into a PTY.
//	SendSignal   GET commands, POST signal          SIGKILL, SIGTERM.
//	CloseStdin   GET commands, POST stdin?eof       idempotent; not for a PTY.
//	Update       GET commands, POST resize          pty.size only.
//	StreamInput  —                                  unimplemented (client streaming; no SDK uses it).
//
// Decisions where Corral and envd differ:
//
//   - Shell: the SDK runs every command as "/bin/bash -l -c CMD" and every PTY as
//     "/bin/bash -i -l". Many Corral bases (busybox, alpine) have no bash, so when the cmd is
//     exactly /bin/bash and the sandbox has no /bin/bash, the gateway runs /bin/sh with the same
//     arguments (sh accepts -l, -c and -i too). Whether a sandbox has bash is asked once (a stat)
//     and remembered per sandbox: a "yes" for good, a "no" for a minute, so installing bash is
//     noticed. List then shows /bin/sh, what actually runs.
//   - User and working directory: the user is the request's (HTTP Basic user name), else the
//     sandbox's default (Corral: the base image's user, else root). No cwd leaves the default to
//     Corral (the image's working directory, else the user's home, as envd does). A relative cwd
//     ("proj", "~/proj") is resolved against the user's home as the sandbox's /etc/passwd names it
//     ("/" when the user has no entry, as Corral's agent does), because Corral takes absolute
//     paths only.
//   - Environment: envs are added as KEY=VALUE, sorted by key, over the sandbox's env; Corral
//     sets HOME (and TERM for a PTY), not USER and LOGNAME.
//   - stdin: "stdin": false (the SDK's default) starts the command without an open stdin, so it
//     reads end of file as from /dev/null; absent or true starts it with open_stdin, kept open
//     for SendInput until CloseStdin. A PTY's input is the terminal and is never closed.
//   - Output Corral dropped because the command exceeded the sandbox's output limit ("truncated"
//     events) is skipped with a warning in the gateway's log: envd has no way to say so.
//   - Tags: Corral keeps no process tags. Start with a tag is refused (unimplemented), and a
//     selector by tag finds nothing (not_found), so callers select by pid, as the SDK does.
//   - End event: exit N is {exitCode: N, exited: true, status: "exit status N"}, with error
//     "exit status N" when N ≠ 0; a signal is {exitCode: -1, exited: false, status:
//     "signal: killed"} (Go's wording, as envd reports it), with error saying why when Corral
//     knows (timeout, out of memory). Corral's own start error (not executable) is the error.
//   - Errors: Corral's 400 is invalid_argument, 401 unauthenticated, 403 permission_denied, 404
//     not_found, 409 failed_precondition, 413 and 429 resource_exhausted, 503 unavailable, others
//     internal (logged); an unknown pid is not_found "process with pid N not found". On the
//     sandbox itself (start, list) a 404 or 409 means the sandbox is gone or not running and is
//     answered unavailable, which the SDK reports as a sandbox that is not running.
//
// Concurrency: a stream handler runs one goroutine besides its own, the keepalive ticker,
// which it stops (and waits for) before sending the end event; the shell cache is protected by
// its mutex.

// processMethod returns the handler of a method of envd's process.Process service.
func (g *Gateway) processMethod(name string) envdHandler {
	switch name {
	case "Start":
		return g.processStart
	case "Connect":
		return g.processConnect
	case "List":
		return g.processList
	case "SendInput":
		return g.processSendInput
	case "SendSignal":
		return g.processSendSignal
	case "CloseStdin":
		return g.processCloseStdin
	case "Update":
		return g.processUpdate
	case "StreamInput":
		return func(w http.ResponseWriter, r *http.Request, t *sandboxTarget) {
			writeUnary(w, nil, rpcErrorf(codeUnimplemented, "process.Process/StreamInput (client streaming) is not served: send input with SendInput"))
		}
	}
	return func(w http.ResponseWriter, r *http.Request, t *sandboxTarget) {
		writeUnary(w, nil, rpcErrorf(codeUnimplemented, "process.Process/%s is not a method of envd's process service", name))
	}
}

// The messages of process.proto in the proto3 JSON mapping. Pointers mark fields whose absence
// means something; procUint32 and procBytes accept every form protojson accepts.

// processConfig is ProcessConfig.
type processConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  *string           `json:"cwd,omitempty"`
}

// processPTY is PTY.
type processPTY struct {
	Size *processPTYSize `json:"size"`
}

// processPTYSize is PTY.Size.
type processPTYSize struct {
	Cols procUint32 `json:"cols"`
	Rows procUint32 `json:"rows"`
}

// processStartRequest is StartRequest.
type processStartRequest struct {
	Process *processConfig `json:"process"`
	PTY     *processPTY    `json:"pty"`
	Tag     *string        `json:"tag"`
	// Stdin absent means true (envd's backwards compatibility).
	Stdin *bool `json:"stdin"`
}

// processSelector is ProcessSelector (a oneof: pid or tag).
type processSelector struct {
	PID *procUint32 `json:"pid"`
	Tag *string     `json:"tag"`
}

// processSelectRequest is ConnectRequest and CloseStdinRequest.
type processSelectRequest struct {
	Process *processSelector `json:"process"`
}

// processInput is ProcessInput (a oneof: stdin or pty).
type processInput struct {
	Stdin procBytes `json:"stdin"`
	PTY   procBytes `json:"pty"`
}

// processSendInputRequest is SendInputRequest.
type processSendInputRequest struct {
	Process *processSelector `json:"process"`
	Input   *processInput    `json:"input"`
}

// processSendSignalRequest is SendSignalRequest.
type processSendSignalRequest struct {
	Process *processSelector `json:"process"`
	Signal  processSignal    `json:"signal"`
}

// processUpdateRequest is UpdateRequest.
type processUpdateRequest struct {
	Process *processSelector `json:"process"`
	PTY     *processPTY      `json:"pty"`
}

// processEventMessage is StartResponse and ConnectResponse.
type processEventMessage struct {
	Event processEvent `json:"event"`
}

// processEvent is ProcessEvent: exactly one field is set.
type processEvent struct {
	Start     *processStartEvent `json:"start,omitempty"`
	Data      *processDataEvent  `json:"data,omitempty"`
	End       *processEndEvent   `json:"end,omitempty"`
	Keepalive *struct{}          `json:"keepalive,omitempty"`
}

// processStartEvent is ProcessEvent.StartEvent.
type processStartEvent struct {
	PID uint32 `json:"pid,omitempty"`
}

// processDataEvent is ProcessEvent.DataEvent (a oneof: stdout, stderr or pty).
type processDataEvent struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	PTY    []byte `json:"pty,omitempty"`
}

// processEndEvent is ProcessEvent.EndEvent.
type processEndEvent struct {
	ExitCode int32   `json:"exitCode,omitempty"`
	Exited   bool    `json:"exited,omitempty"`
	Status   string  `json:"status,omitempty"`
	Error    *string `json:"error,omitempty"`
}

// processInfo is ProcessInfo.
type processInfo struct {
	Config processConfig `json:"config"`
	PID    uint32        `json:"pid,omitempty"`
}

// processListResponse is ListResponse.
type processListResponse struct {
	Processes []processInfo `json:"processes,omitempty"`
}

// procUint32 is a uint32 in proto3 JSON: a number or a decimal string.
type procUint32 uint32

// UnmarshalJSON accepts 7, 7.0 and "7".
func (u *procUint32) UnmarshalJSON(b []byte) error {
	s := string(b)
	if s == "null" {
		return nil
	}
	if uq, err := strconv.Unquote(s); err == nil {
		s = uq
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || f > 1<<32-1 || f != float64(uint32(f)) {
		return fmt.Errorf("%s is not a uint32", b)
	}
	*u = procUint32(f)
	return nil
}

// procBytes is bytes in proto3 JSON: standard or URL-safe base64, padded or not. A present but
// empty value is non-nil.
type procBytes []byte

// UnmarshalJSON decodes a base64 string.
func (p *procBytes) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	enc := base64.StdEncoding
	if strings.ContainsAny(s, "-_") {
		enc = base64.URLEncoding
	}
	out, err := enc.WithPadding(base64.NoPadding).DecodeString(strings.TrimRight(s, "="))
	if err != nil {
		return fmt.Errorf("bytes: %w", err)
	}
	*p = append(procBytes{}, out...)
	return nil
}

// processSignal is the Signal enum: its name or its number.
type processSignal int

// The values of the Signal enum.
const (
	signalUnspecified processSignal = 0
	signalSIGKILL     processSignal = 9
	signalSIGTERM     processSignal = 15
)

// UnmarshalJSON accepts "SIGNAL_SIGKILL" or 9.
func (s *processSignal) UnmarshalJSON(b []byte) error {
	var name string
	if err := json.Unmarshal(b, &name); err != nil {
		var n int32
		if err := json.Unmarshal(b, &n); err != nil {
			return fmt.Errorf("signal %s: want a Signal name or number", b)
		}
		*s = processSignal(n)
		return nil
	}
	switch name {
	case "SIGNAL_UNSPECIFIED":
		*s = signalUnspecified
	case "SIGNAL_SIGKILL":
		*s = signalSIGKILL
	case "SIGNAL_SIGTERM":
		*s = signalSIGTERM
	default:
		return fmt.Errorf("signal %q: want SIGNAL_SIGKILL or SIGNAL_SIGTERM", name)
	}
	return nil
}

// keepaliveMessage is the event sent on an idle stream.
var keepaliveMessage = processEventMessage{Event: processEvent{Keepalive: &struct{}{}}}

// processStart serves Start: run a command and stream its events until it ends. It is one
// Corral call, an exec: its stream's start event names the command and its pid, and the
// command outlives the stream (Corral's exec survives its client leaving as a background
// command, reachable with Connect, SendInput and SendSignal by pid).
func (g *Gateway) processStart(w http.ResponseWriter, r *http.Request, t *sandboxTarget) {
	var req processStartRequest
	err := readStreamRequest(r, &req)
	var exec corral.ExecRequest
	if err == nil {
		exec, err = g.processExecRequest(r, t, &req)
	}
	var out *corral.Stream
	var first corral.Event
	if err == nil {
		out, err = t.c.Exec(r.Context(), t.id, exec)
		if err == nil {
			first, err = out.Next()
			if err == nil && (first.Type != corral.EventStart || first.Pid == 0) {
				err = fmt.Errorf("exec stream began with %q, not a start event with a pid", first.Type)
			}
			if err != nil {
				out.Close()
				g.log.Warn("e2b process: exec stream", "sandbox", t.id, "err", err)
				err = rpcErrorf(codeUnavailable, "start the process: %v", err)
			}
		} else {
			err = g.processCorralError(r, t, err, true)
		}
	}
	s := startStream(w)
	if err != nil {
		s.End(err)
		return
	}
	defer out.Close()
	// stdin false: the command was started without open stdin (open_stdin unset), so it reads
	// end of file as from /dev/null.
	if s.Send(processEventMessage{Event: processEvent{Start: &processStartEvent{PID: uint32(first.Pid)}}}) != nil {
		return // the client left; the command runs on
	}
	cmd := &corral.Command{ID: first.CommandID, Pid: first.Pid, TTY: exec.TTY}
	g.processStream(r.Context(), r, s, t, cmd, out)
}

// processConnect serves Connect: stream the live output of a running process until it ends.
func (g *Gateway) processConnect(w http.ResponseWriter, r *http.Request, t *sandboxTarget) {
	var req processSelectRequest
	err := readStreamRequest(r, &req)
	var cmd *corral.Command
	if err == nil {
		cmd, err = g.processFind(r, t, req.Process)
	}
	s := startStream(w)
	if err != nil {
		s.End(err)
		return
	}
	ctx := r.Context()
	if d := streamTimeout(r); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	if s.Send(processEventMessage{Event: processEvent{Start: &processStartEvent{PID: uint32(cmd.Pid)}}}) != nil {
		return
	}
	g.processFollow(ctx, r, s, t, cmd, cmd.OutputEnd)
}

// processFollow streams a command's output from offset, with keepalives, then its end event
// and the end of the stream. It returns without ending the stream when the client has left.
func (g *Gateway) processFollow(ctx context.Context, r *http.Request, s *stream, t *sandboxTarget, cmd *corral.Command, offset int64) {
	out, err := t.c.Attach(ctx, t.id, cmd.ID, offset, true)
	if err != nil {
		if r.Context().Err() == nil {
			s.End(g.processStreamError(ctx, r, t, cmd, err))
		}
		return
	}
	defer out.Close()
	g.processStream(ctx, r, s, t, cmd, out)
}

// processStream is processFollow on a stream of cmd's output already open.
func (g *Gateway) processStream(ctx context.Context, r *http.Request, s *stream, t *sandboxTarget, cmd *corral.Command, out *corral.Stream) {
	stop := processKeepalive(s, keepaliveEvery(r))
	defer stop()
	for {
		ev, err := out.Next()
		if err != nil {
			stop()
			if r.Context().Err() == nil {
				s.End(g.processStreamError(ctx, r, t, cmd, err))
			}
			return
		}
		var data processDataEvent
		switch ev.Type {
		case corral.EventStdout:
			data.Stdout = ev.Data
		case corral.EventStderr:
			data.Stderr = ev.Data
		case corral.EventTruncated:
			g.log.Warn("e2b process: output dropped by Corral's output limit", "sandbox", t.id, "command", cmd.ID, "pid", cmd.Pid, "bytes", ev.Dropped)
			continue
		case corral.EventExit:
			stop()
			if s.Send(processEventMessage{Event: processEvent{End: processEnd(ev.Exit)}}) == nil {
				s.End(nil)
			}
			return
		default:
			continue
		}
		if len(ev.Data) == 0 {
			continue
		}
		if cmd.TTY {
			data = processDataEvent{PTY: ev.Data}
		}
		if s.Send(processEventMessage{Event: processEvent{Data: &data}}) != nil {
			return // the client left; the command runs on
		}
	}
}

// processStreamError is the error that ends a stream whose output could not be followed.
func (g *Gateway) processStreamError(ctx context.Context, r *http.Request, t *sandboxTarget, cmd *corral.Command, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return rpcErrorf(codeDeadlineExceeded, "the stream of process %d reached its Connect-Timeout-Ms; the process runs on", cmd.Pid)
	}
	if _, ok := errors.AsType[*corral.APIError](err); ok {
		return g.processCorralError(r, t, err, false)
	}
	g.log.Warn("e2b process: output stream lost", "sandbox", t.id, "command", cmd.ID, "err", err)
	return rpcErrorf(codeUnavailable, "lost the output of process %d: %v; connect again to follow it", cmd.Pid, err)
}

// processKeepalive sends a keepalive event on s whenever it has sent nothing for every, until
// the returned stop is called; stop waits for the ticker to end and may be called again.
func processKeepalive(s *stream, every time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTimer(max(every-s.idleFor(), 0))
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if idle := s.idleFor(); idle < every {
				t.Reset(every - idle)
				continue
			}
			if s.Send(keepaliveMessage) != nil {
				return
			}
			t.Reset(every)
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		wg.Wait()
	}
}

// signalStatus is how Go (and so envd) words a signal in "signal: ..." statuses.
var signalStatus = map[string]string{
	"SIGHUP": "hangup", "SIGINT": "interrupt", "SIGQUIT": "quit", "SIGILL": "illegal instruction",
	"SIGTRAP": "trace/breakpoint trap", "SIGABRT": "aborted", "SIGBUS": "bus error",
	"SIGFPE": "floating point exception", "SIGKILL": "killed", "SIGUSR1": "user defined signal 1",
	"SIGSEGV": "segmentation fault", "SIGUSR2": "user defined signal 2", "SIGPIPE": "broken pipe",
	"SIGALRM": "alarm clock", "SIGTERM": "terminated",
}

// processEnd maps how a Corral command ended onto envd's end event.
func processEnd(x *corral.Exit) *processEndEvent {
	if x == nil {
		x = &corral.Exit{}
	}
	end := &processEndEvent{ExitCode: int32(x.Code), Exited: true, Status: fmt.Sprintf("exit status %d", x.Code)}
	if x.Signal != "" || x.Code < 0 {
		word, ok := signalStatus[x.Signal]
		switch {
		case ok:
		case x.Signal != "":
			word = x.Signal
		default:
			word = "unknown"
		}
		end.ExitCode, end.Exited, end.Status = -1, false, "signal: "+word
	}
	msg := end.Status
	switch {
	case x.Error != "":
		msg = x.Error
	case x.TimedOut:
		msg += " (the process ran past its timeout, the stream's Connect-Timeout-Ms)"
	case x.OOMKilled:
		msg += " (out of memory)"
	}
	if end.ExitCode != 0 || x.Error != "" {
		end.Error = &msg
	}
	return end
}

// processExecRequest turns a Start request into the Corral command to start.
func (g *Gateway) processExecRequest(r *http.Request, t *sandboxTarget, req *processStartRequest) (corral.ExecRequest, error) {
	p := req.Process
	switch {
	case p == nil || p.Cmd == "":
		return corral.ExecRequest{}, rpcErrorf(codeInvalidArgument, "process.cmd: a command is required")
	case req.Tag != nil:
		return corral.ExecRequest{}, rpcErrorf(codeUnimplemented, "tag: Corral keeps no process tags; leave it out and select the process by pid")
	}
	exec := corral.ExecRequest{Argv: append([]string{p.Cmd}, p.Args...), User: t.user}
	// Stdin absent means true (envd's backwards compatibility); the SDK sends false unless asked.
	exec.OpenStdin = req.Stdin == nil || *req.Stdin
	for _, k := range slices.Sorted(maps.Keys(p.Envs)) {
		exec.Env = append(exec.Env, k+"="+p.Envs[k])
	}
	if req.PTY != nil {
		exec.TTY = true
		if sz := req.PTY.Size; sz != nil {
			if sz.Rows > 0xffff || sz.Cols > 0xffff {
				return exec, rpcErrorf(codeInvalidArgument, "pty.size: %dx%d is too large", sz.Rows, sz.Cols)
			}
			exec.Rows, exec.Cols = uint16(sz.Rows), uint16(sz.Cols)
		}
	}
	if d := streamTimeout(r); d > 0 {
		exec.Timeout = d.String()
	}
	if p.Cwd != nil && *p.Cwd != "" {
		cwd, err := g.processCwd(r, t, *p.Cwd)
		if err != nil {
			return exec, err
		}
		exec.Cwd = cwd
	}
	if exec.Argv[0] == "/bin/bash" && !g.processHasBash(r, t) {
		exec.Argv[0] = "/bin/sh"
	}
	return exec, nil
}

// processCwd resolves a cwd as the filesystem service resolves paths (fsCall.abs): "~" and a
// relative path are under the request's user's home from the sandbox's passwd, cached.
func (g *Gateway) processCwd(r *http.Request, t *sandboxTarget, cwd string) (string, error) {
	if strings.HasPrefix(cwd, "/") && !strings.ContainsRune(cwd, 0) {
		return path.Clean(cwd), nil
	}
	c, err := g.fsCallFor(r.Context(), t, t.user)
	if err != nil {
		return "", err
	}
	return c.abs(cwd)
}

// processShells remembers which sandboxes have /bin/bash (a Gateway's, by sandbox ID).
type processShells struct {
	mu sync.Mutex
	// m is protected by mu.
	m map[string]processShellEntry
}

type processShellEntry struct {
	bash bool
	at   time.Time
}

const (
	// maxShellEntries bounds processShells; past it an arbitrary entry goes.
	maxShellEntries = 4096
	// noBashFor is how long "no /bin/bash" is believed.
	noBashFor = time.Minute
)

// processHasBash reports whether the sandbox has /bin/bash. When Corral cannot say (an error
// other than not found), it answers yes: the command then fails or runs as asked.
func (g *Gateway) processHasBash(r *http.Request, t *sandboxTarget) bool {
	key, shells := t.id, &g.shells
	shells.mu.Lock()
	e, ok := shells.m[key]
	shells.mu.Unlock()
	if ok && (e.bash || time.Since(e.at) < noBashFor) {
		return e.bash
	}
	_, err := t.c.Stat(r.Context(), t.id, "/bin/bash")
	if err != nil && !corral.IsNotFound(err) {
		return true
	}
	shells.mu.Lock()
	defer shells.mu.Unlock()
	for k := range shells.m {
		if len(shells.m) < maxShellEntries {
			break
		}
		delete(shells.m, k)
	}
	shells.m[key] = processShellEntry{bash: err == nil, at: time.Now()}
	return err == nil
}

// processFind returns the running command a selector names.
func (g *Gateway) processFind(r *http.Request, t *sandboxTarget, sel *processSelector) (*corral.Command, error) {
	switch {
	case sel == nil || sel.PID == nil && sel.Tag == nil:
		return nil, rpcErrorf(codeInvalidArgument, "process: select the process by pid")
	case sel.PID == nil:
		return nil, rpcErrorf(codeNotFound, "process with tag %q not found (Corral keeps no process tags: select by pid)", *sel.Tag)
	}
	cmds, err := t.c.Commands(r.Context(), t.id)
	if err != nil {
		return nil, g.processCorralError(r, t, err, true)
	}
	for i := len(cmds) - 1; i >= 0; i-- {
		if cmds[i].State == corral.StateRunning && cmds[i].Pid == int(*sel.PID) {
			return &cmds[i], nil
		}
	}
	return nil, rpcErrorf(codeNotFound, "process with pid %d not found", *sel.PID)
}

// processList serves List: the sandbox's running commands.
func (g *Gateway) processList(w http.ResponseWriter, r *http.Request, t *sandboxTarget) {
	var req struct{}
	if err := readUnary(r, &req); err != nil {
		writeUnary(w, nil, err)
		return
	}
	cmds, err := t.c.Commands(r.Context(), t.id)
	if err != nil {
		writeUnary(w, nil, g.processCorralError(r, t, err, true))
		return
	}
	var out processListResponse
	for _, c := range cmds {
		if c.State != corral.StateRunning || len(c.Argv) == 0 {
			continue
		}
		out.Processes = append(out.Processes, processInfo{
			Config: processConfig{Cmd: c.Argv[0], Args: c.Argv[1:]},
			PID:    uint32(c.Pid),
		})
	}
	writeUnary(w, out, nil)
}

// processSendInput serves SendInput: bytes into a process's stdin or terminal.
func (g *Gateway) processSendInput(w http.ResponseWriter, r *http.Request, t *sandboxTarget) {
	var req processSendInputRequest
	if err := readUnary(r, &req); err != nil {
		writeUnary(w, nil, err)
		return
	}
	in := req.Input
	if in == nil || in.Stdin == nil && in.PTY == nil {
		writeUnary(w, nil, rpcErrorf(codeInvalidArgument, "input: give stdin or pty bytes"))
		return
	}
	cmd, err := g.processFind(r, t, req.Process)
	if err != nil {
		writeUnary(w, nil, err)
		return
	}
	data := in.Stdin
	switch {
	case cmd.TTY && in.PTY == nil:
		err = rpcErrorf(codeFailedPrecond, "process %d has a terminal: send its input as input.pty", cmd.Pid)
	case !cmd.TTY && in.Stdin == nil:
		err = rpcErrorf(codeFailedPrecond, "process %d has no terminal: send its input as input.stdin", cmd.Pid)
	case cmd.TTY:
		data = in.PTY
	}
	if err == nil {
		if err = t.c.WriteStdin(r.Context(), t.id, cmd.ID, bytes.NewReader(data), false); err != nil {
			err = g.processCorralError(r, t, err, false)
		}
	}
	writeUnary(w, struct{}{}, err)
}

// processSendSignal serves SendSignal.
func (g *Gateway) processSendSignal(w http.ResponseWriter, r *http.Request, t *sandboxTarget) {
	var req processSendSignalRequest
	if err := readUnary(r, &req); err != nil {
		writeUnary(w, nil, err)
		return
	}
	var sig string
	switch req.Signal {
	case signalSIGKILL:
		sig = "SIGKILL"
	case signalSIGTERM:
		sig = "SIGTERM"
	case signalUnspecified:
		writeUnary(w, nil, rpcErrorf(codeUnimplemented, "signal: SIGNAL_UNSPECIFIED is not a signal: send SIGNAL_SIGKILL or SIGNAL_SIGTERM"))
		return
	default:
		writeUnary(w, nil, rpcErrorf(codeInvalidArgument, "signal: %d is not a value of Signal (SIGNAL_SIGKILL, SIGNAL_SIGTERM)", req.Signal))
		return
	}
	cmd, err := g.processFind(r, t, req.Process)
	if err == nil {
		if err = t.c.Signal(r.Context(), t.id, cmd.ID, sig); err != nil {
			if corral.IsConflict(err) || corral.IsNotFound(err) {
				// It exited since it was looked up.
				err = rpcErrorf(codeNotFound, "process with pid %d not found (it has exited)", cmd.Pid)
			} else {
				err = g.processCorralError(r, t, err, false)
			}
		}
	}
	writeUnary(w, struct{}{}, err)
}

// processCloseStdin serves CloseStdin: end of file on a process's stdin, idempotently.
func (g *Gateway) processCloseStdin(w http.ResponseWriter, r *http.Request, t *sandboxTarget) {
	var req processSelectRequest
	if err := readUnary(r, &req); err != nil {
		writeUnary(w, nil, err)
		return
	}
	cmd, err := g.processFind(r, t, req.Process)
	switch {
	case err != nil:
	case cmd.TTY:
		err = rpcErrorf(codeFailedPrecond, "process %d has a terminal, whose input cannot be closed: send it an end-of-file character (\\x04) as input.pty", cmd.Pid)
	default:
		err = t.c.WriteStdin(r.Context(), t.id, cmd.ID, bytes.NewReader(nil), true)
		if corral.IsConflict(err) {
			err = nil // closed already
		} else if err != nil {
			err = g.processCorralError(r, t, err, false)
		}
	}
	writeUnary(w, struct{}{}, err)
}

// processUpdate serves Update: a new terminal size.
func (g *Gateway) processUpdate(w http.ResponseWriter, r *http.Request, t *sandboxTarget) {
	var req processUpdateRequest
	if err := readUnary(r, &req); err != nil {
		writeUnary(w, nil, err)
		return
	}
	if req.PTY == nil || req.PTY.Size == nil {
		writeUnary(w, nil, rpcErrorf(codeInvalidArgument, "pty.size: the new terminal size is required (it is all Update changes)"))
		return
	}
	sz := req.PTY.Size
	if sz.Rows == 0 || sz.Cols == 0 || sz.Rows > 0xffff || sz.Cols > 0xffff {
		writeUnary(w, nil, rpcErrorf(codeInvalidArgument, "pty.size: %dx%d: rows and cols must be between 1 and 65535", sz.Rows, sz.Cols))
		return
	}
	cmd, err := g.processFind(r, t, req.Process)
	if err == nil {
		if err = t.c.Resize(r.Context(), t.id, cmd.ID, uint16(sz.Rows), uint16(sz.Cols)); err != nil {
			err = g.processCorralError(r, t, err, false)
		}
	}
	writeUnary(w, struct{}{}, err)
}

// processCorralError turns the error of a Corral call into a Connect error. With onSandbox the
// call was on the sandbox itself (start a command, list them): Corral's not found or conflict
// then says the sandbox is gone or not running, which is envd's unavailable.
func (g *Gateway) processCorralError(r *http.Request, t *sandboxTarget, err error, onSandbox bool) error {
	if re, ok := errors.AsType[*rpcError](err); ok {
		return re
	}
	ce, ok := errors.AsType[*corral.APIError](err)
	switch {
	case ok && onSandbox && (gone(err) || ce.Status == http.StatusConflict):
		return rpcErrorf(codeUnavailable, "sandbox %s is not running: %s", t.id, ce.Error())
	case ok:
		code, known := connectCode(ce)
		if !known {
			g.log.Error("e2b process: corral API failed", "path", r.URL.Path, "sandbox", t.id, "status", ce.Status, "err", ce.Message)
			return rpcErrorf(codeInternal, "the Corral API failed (status %d); see the gateway's log", ce.Status)
		}
		if code == codeUnauthenticated {
			return rpcErrorf(code, "Corral refused the gateway's service token: %s", ce.Error())
		}
		return rpcErrorf(code, "%s", ce.Error())
	case errors.Is(err, context.Canceled):
		return rpcErrorf(codeCanceled, "request cancelled before Corral answered")
	case errors.Is(err, context.DeadlineExceeded):
		return rpcErrorf(codeDeadlineExceeded, "Corral did not answer in time")
	}
	g.log.Error("e2b process: reach corral API", "path", r.URL.Path, "sandbox", t.id, "err", err)
	return rpcErrorf(codeUnavailable, "the Corral API is unreachable from the E2B gateway")
}
