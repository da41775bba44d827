package corraltest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// A Program is a fake command: the server runs it on its own goroutine instead of starting a
// process. It returns how the command ended. Its context ends when the command is signalled
// or times out, or its sandbox is deleted; the server then reports the signal as the exit,
// whatever the program returns.
type Program func(ctx context.Context, p *Process) corral.Exit

// Process is what a [Program] sees of the command it plays.
type Process struct {
	// Args is the argv; with ExecRequest.Shell, the single shell string split into fields.
	Args []string
	// Env is the sandbox's environment followed by the request's.
	Env  []string
	Cwd  string
	User string
	TTY  bool
	// Rows and Cols are the initial terminal size of a TTY command.
	Rows, Cols uint16
	// Stdin reads what the client sends; it returns io.EOF once the client closes stdin and
	// an error once the command's context has ended.
	Stdin io.Reader
	// Stdout and Stderr append to the command's output. With TTY, both are the stdout stream.
	Stdout, Stderr io.Writer
	// Resizes delivers terminal sizes sent with the resize route. Sizes are dropped when the
	// program has not read the previous ones.
	Resizes <-chan corral.ResizeRequest
}

// programEntry is a registered program, or the failure to start one.
type programEntry struct {
	run      Program
	startErr *corral.Exit
}

// Program registers p under name, replacing any built-in one. A command runs the program
// registered under the base name of its Args[0].
func (s *Server) Program(name string, p Program) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.programs[name] = programEntry{run: p}
}

// StartFailure makes commands named name fail to start with exit, whose Error says why. As on
// the real server, a failure with code 127 (no such program) is refused with 400 on field
// "argv"; any other is a command that ends at once with exit.
func (s *Server) StartFailure(name string, exit corral.Exit) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.programs[name] = programEntry{startErr: &exit}
}

// builtinPrograms returns the programs every Server starts with:
//
//	echo ARGS...   prints its arguments joined by spaces, and a newline
//	stderr ARGS... the same, on stderr
//	cat            copies stdin to stdout
//	true, false    exit 0, exit 1
//	exit N         exits with code N
//	sleep D        waits for the Go duration D, or until signalled
//	env, pwd       print the environment, the working directory
//	whoami         prints the user ("root" when none was asked for)
//
// Any other name is a missing program: the request is refused with 400 on field "argv".
func builtinPrograms() map[string]programEntry {
	line := func(w io.Writer, args []string) { fmt.Fprintln(w, strings.Join(args, " ")) }
	progs := map[string]Program{
		"echo":   func(_ context.Context, p *Process) corral.Exit { line(p.Stdout, p.Args[1:]); return corral.Exit{} },
		"stderr": func(_ context.Context, p *Process) corral.Exit { line(p.Stderr, p.Args[1:]); return corral.Exit{} },
		"cat": func(_ context.Context, p *Process) corral.Exit {
			if _, err := io.Copy(p.Stdout, p.Stdin); err != nil {
				return corral.Exit{Code: 1}
			}
			return corral.Exit{}
		},
		"true":  func(context.Context, *Process) corral.Exit { return corral.Exit{} },
		"false": func(context.Context, *Process) corral.Exit { return corral.Exit{Code: 1} },
		"exit": func(_ context.Context, p *Process) corral.Exit {
			code := 0
			if len(p.Args) > 1 {
				code, _ = strconv.Atoi(p.Args[1])
			}
			return corral.Exit{Code: code}
		},
		"sleep": func(ctx context.Context, p *Process) corral.Exit {
			d := time.Hour
			if len(p.Args) > 1 {
				// sleep's operand: seconds ("600", as coreutils and busybox read it) or a Go duration.
				if n, err := strconv.ParseFloat(p.Args[1], 64); err == nil {
					d = time.Duration(n * float64(time.Second))
				} else {
					d, _ = time.ParseDuration(p.Args[1])
				}
			}
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			return corral.Exit{}
		},
		"env": func(_ context.Context, p *Process) corral.Exit {
			for _, e := range p.Env {
				fmt.Fprintln(p.Stdout, e)
			}
			return corral.Exit{}
		},
		"pwd": func(_ context.Context, p *Process) corral.Exit { fmt.Fprintln(p.Stdout, p.Cwd); return corral.Exit{} },
		"whoami": func(_ context.Context, p *Process) corral.Exit {
			u := p.User
			if u == "" {
				u = "root"
			}
			fmt.Fprintln(p.Stdout, u)
			return corral.Exit{}
		},
	}
	out := make(map[string]programEntry, len(progs))
	for name, p := range progs {
		out[name] = programEntry{run: p}
	}
	return out
}

// command is the fake's state for one command. Fields are protected by Server.mu except
// stdin, which has its own lock and is used without holding Server.mu.
type command struct {
	info    corral.Command
	events  []corral.Event // stdout, stderr and (last) exit events; elements never change
	size    int64          // output bytes so far
	changed chan struct{}  // closed and replaced whenever events grows
	stdin   *stdinBuf
	cancel  context.CancelCauseFunc
	resizes chan corral.ResizeRequest
}

func (c *command) view() corral.Command {
	v := c.info
	v.OutputEnd = c.size
	if v.Exit != nil {
		e := *v.Exit
		v.Exit = &e
	}
	return v
}

// appendLocked adds an event and wakes the readers of the output.
//
// Preconditions: s.mu is held.
func (c *command) appendLocked(ev corral.Event) {
	c.events = append(c.events, ev)
	close(c.changed)
	c.changed = make(chan struct{})
}

// signalCause is the cancellation cause of a signalled command.
type signalCause struct{ name string }

func (e signalCause) Error() string { return "signal " + e.name }

var errTimedOut = errors.New("command timed out")

// startLocked starts req in sb and returns the command, or why the request is refused.
//
// Preconditions: s.mu is held.
func (s *Server) startLocked(sb *sandbox, req corral.ExecRequest) (*command, *httpError) {
	argv := req.Argv
	if req.Shell {
		if len(argv) != 1 {
			return nil, invalid("argv", "a shell command is one string, got %d", len(argv))
		}
		argv = strings.Fields(argv[0])
	}
	if len(argv) == 0 || argv[0] == "" {
		return nil, invalid("argv", "argv is empty")
	}
	var timeout time.Duration
	if req.Timeout != "" {
		var err error
		if timeout, err = time.ParseDuration(req.Timeout); err != nil || timeout <= 0 {
			return nil, invalid("timeout", "timeout %q is not a positive Go duration", req.Timeout)
		}
	}
	if req.Cwd != "" && !strings.HasPrefix(req.Cwd, "/") {
		return nil, invalid("cwd", "%q is not an absolute path", req.Cwd)
	}
	for i, e := range req.Env {
		if !strings.Contains(e, "=") {
			return nil, invalid(fmt.Sprintf("env[%d]", i), "is not KEY=VALUE (no '=')")
		}
	}
	if x := sb.exclusiveLocked(); x != nil {
		return nil, conflict("an exclusive command (%s) is running in this sandbox; retry when it has ended", x.info.ID)
	}
	entry, ok := s.programs[path.Base(argv[0])]
	switch {
	case !ok:
		return nil, invalid("argv", "exec: %q: executable file not found in $PATH", argv[0])
	case entry.startErr != nil && entry.startErr.Code == 127:
		return nil, invalid("argv", "%s", entry.startErr.Error)
	case entry.startErr != nil:
		exit := *entry.startErr
		entry.run = func(context.Context, *Process) corral.Exit { return exit }
	}
	sb.spec.LastActivityAt = timeNow()

	s.nextCommand++
	cmd := &command{
		info: corral.Command{
			ID:        "c-" + strconv.Itoa(s.nextCommand),
			Argv:      req.Argv,
			Pid:       100 + s.nextCommand,
			TTY:       req.TTY,
			Exclusive: req.Exclusive,
			State:     "running",
			StartedAt: timeNow(),
		},
		changed: make(chan struct{}),
		stdin:   newStdinBuf(),
		resizes: make(chan corral.ResizeRequest, 1),
	}
	sb.cmds[cmd.info.ID] = cmd
	sb.cmdList = append(sb.cmdList, cmd.info.ID)

	ctx, cancel := context.WithCancelCause(sb.ctx)
	cmd.cancel = cancel
	var stopTimeout context.CancelFunc = func() {}
	if timeout > 0 {
		ctx, stopTimeout = context.WithTimeoutCause(ctx, timeout, errTimedOut)
	}
	stdout := &outputWriter{s: s, cmd: cmd, typ: corral.EventStdout}
	stderr := io.Writer(&outputWriter{s: s, cmd: cmd, typ: corral.EventStderr})
	if req.TTY {
		stderr = stdout
	}
	proc := &Process{
		Args:    argv,
		Env:     append(append([]string{}, sb.spec.Env...), req.Env...),
		Cwd:     req.Cwd,
		User:    req.User,
		TTY:     req.TTY,
		Rows:    req.Rows,
		Cols:    req.Cols,
		Stdin:   cmd.stdin,
		Stdout:  stdout,
		Stderr:  stderr,
		Resizes: cmd.resizes,
	}
	if proc.Cwd == "" {
		proc.Cwd = "/"
	}
	// A program blocked reading stdin must see its context end.
	stopAfter := context.AfterFunc(ctx, func() { cmd.stdin.CloseWithError(context.Cause(ctx)) })
	go func() {
		exit := entry.run(ctx, proc)
		// Why it ended is read before the timeout's own cancel would become the cause.
		cause := context.Cause(ctx)
		stopAfter()
		stopTimeout()
		cmd.stdin.CloseWithError(io.ErrClosedPipe)

		s.mu.Lock()
		defer s.mu.Unlock()
		var sig signalCause
		switch {
		case errors.As(cause, &sig):
			exit = corral.Exit{Code: -1, Signal: sig.name}
		case errors.Is(cause, errTimedOut):
			exit = corral.Exit{Code: -1, Signal: "SIGKILL", TimedOut: true}
		case cause != nil:
			exit = corral.Exit{Code: -1, Signal: "SIGKILL"}
		}
		cancel(nil)
		cmd.info.State = "exited"
		cmd.info.EndedAt = timeNow()
		cmd.info.Exit = &exit
		e := exit
		cmd.appendLocked(corral.Event{Type: corral.EventExit, Exit: &e})
	}()
	return cmd, nil
}

// exclusiveLocked returns sb's running exclusive command, if any. The fake runs no processes, so
// it models only what a client sees of one: other starts and signals are refused while it runs.
//
// Preconditions: the server's mu is held.
func (sb *sandbox) exclusiveLocked() *command {
	for _, c := range sb.cmds {
		if c.info.Exclusive && c.info.Exit == nil {
			return c
		}
	}
	return nil
}

// outputWriter appends what a program writes as stdout or stderr events.
type outputWriter struct {
	s   *Server
	cmd *command
	typ string
}

func (w *outputWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	w.cmd.appendLocked(corral.Event{Type: w.typ, Offset: w.cmd.size, Data: append([]byte(nil), p...)})
	w.cmd.size += int64(len(p))
	return len(p), nil
}

// stdinBuf is a command's stdin: writes never block (the client may write before the program
// reads), reads block until data arrives or the buffer is closed.
type stdinBuf struct {
	mu     sync.Mutex
	buf    []byte        // protected by mu
	err    error         // protected by mu; non-nil once closed: io.EOF, or why reads fail
	wake   chan struct{} // protected by mu; closed and replaced when buf grows or err is set
	closed bool          // protected by mu; no more writes
}

func newStdinBuf() *stdinBuf { return &stdinBuf{wake: make(chan struct{})} }

func (b *stdinBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, io.ErrClosedPipe
	}
	b.buf = append(b.buf, p...)
	close(b.wake)
	b.wake = make(chan struct{})
	return len(p), nil
}

// CloseWithError ends stdin: reads drain the buffer then return err (io.EOF for a clean end).
// Only the first close counts.
func (b *stdinBuf) CloseWithError(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed, b.err = true, err
	close(b.wake)
	b.wake = make(chan struct{})
}

func (b *stdinBuf) Read(p []byte) (int, error) {
	for {
		b.mu.Lock()
		if len(b.buf) > 0 {
			n := copy(p, b.buf)
			b.buf = b.buf[n:]
			b.mu.Unlock()
			return n, nil
		}
		if b.closed {
			err := b.err
			b.mu.Unlock()
			return 0, err
		}
		wake := b.wake
		b.mu.Unlock()
		<-wake
	}
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	streamed := r.URL.Query().Get("stdin") == "stream"
	var req corral.ExecRequest
	var body *bufio.Reader
	rc := http.NewResponseController(w)
	if streamed {
		if err := rc.EnableFullDuplex(); err != nil {
			fail(w, &httpError{http.StatusInternalServerError, corral.CodeInternal, err.Error(), ""})
			return
		}
		body = bufio.NewReader(r.Body)
		line, err := body.ReadBytes('\n')
		if err != nil {
			fail(w, invalid("", "read the request line before stdin: %v", err))
			return
		}
		dec := json.NewDecoder(strings.NewReader(string(line)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			fail(w, invalid("", "decode request: %v", err))
			return
		}
		if len(req.Stdin) > 0 {
			fail(w, invalid("stdin", "stdin is streamed; the request must not carry it"))
			return
		}
	} else if err := decodeBody(r, &req); err != nil {
		fail(w, err)
		return
	}

	s.mu.Lock()
	sb, herr := s.runningLocked(r)
	var cmd *command
	if herr == nil {
		cmd, herr = s.startLocked(sb, req)
	}
	s.mu.Unlock()
	if herr != nil {
		fail(w, herr)
		return
	}

	w.Header().Set("Content-Type", "application/x-ndjson")
	if streamed {
		// The body read may be cut short below, leaving the connection mid-body: never reuse it.
		w.Header().Set("Connection", "close")
	}
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	if streamed {
		copied := make(chan struct{})
		go func() {
			defer close(copied)
			_, err := io.Copy(cmd.stdin, body)
			if err == nil {
				err = io.EOF
			}
			cmd.stdin.CloseWithError(err)
			// The command may be gone with the client still sending: read on, so the client
			// can finish its body instead of having the connection reset under it.
			_, _ = io.Copy(io.Discard, body)
		}()
		// The body must not be read after the handler returns. Give the client a moment to end
		// it (the SDK does on the exit event), then cut a pending read short and wait.
		defer func() {
			t := time.NewTimer(2 * time.Second)
			defer t.Stop()
			select {
			case <-copied:
			case <-t.C:
				_ = rc.SetReadDeadline(time.Now())
				<-copied
			}
		}()
	} else {
		// As the real edge: open_stdin keeps stdin open for WriteStdin after the request's bytes.
		_, _ = cmd.stdin.Write(req.Stdin)
		if !req.OpenStdin && !req.TTY {
			cmd.stdin.CloseWithError(io.EOF)
		}
	}
	if err := enc.Encode(corral.Event{Type: corral.EventStart, CommandID: cmd.info.ID, Pid: cmd.info.Pid}); err != nil {
		return
	}
	_ = rc.Flush()
	s.streamOutput(w, r, cmd, 0, true)
}

// streamOutput writes the command's events from byte offset as NDJSON, ending after the exit
// event or, without follow, after the output produced so far.
func (s *Server) streamOutput(w http.ResponseWriter, r *http.Request, cmd *command, offset int64, follow bool) {
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	next := 0
	for {
		s.mu.Lock()
		evs := cmd.events[next:]
		next = len(cmd.events)
		changed := cmd.changed
		s.mu.Unlock()
		for _, ev := range evs {
			if ev.Type == corral.EventStdout || ev.Type == corral.EventStderr {
				end := ev.Offset + int64(len(ev.Data))
				if end <= offset {
					continue
				}
				if ev.Offset < offset {
					ev.Data = ev.Data[offset-ev.Offset:]
					ev.Offset = offset
				}
			}
			if err := enc.Encode(ev); err != nil {
				return
			}
			if ev.Type == corral.EventExit {
				_ = rc.Flush()
				return
			}
		}
		_ = rc.Flush()
		if !follow {
			return
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		}
	}
}

func (s *Server) startCommand(w http.ResponseWriter, r *http.Request) {
	var req corral.ExecRequest
	if err := decodeBody(r, &req); err != nil {
		fail(w, err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, herr := s.runningLocked(r)
	if herr != nil {
		fail(w, herr)
		return
	}
	cmd, herr := s.startLocked(sb, req)
	if herr != nil {
		fail(w, herr)
		return
	}
	// As the real edge: stdin is req.Stdin then end of file, unless open_stdin keeps it open
	// for WriteStdin (a TTY's input is its terminal).
	_, _ = cmd.stdin.Write(req.Stdin)
	if !req.OpenStdin && !req.TTY {
		cmd.stdin.CloseWithError(io.EOF)
	}
	writeJSON(w, http.StatusCreated, cmd.view())
}

// commandLocked returns the command named by the request's {id} and {cid}.
//
// Preconditions: s.mu is held.
func (s *Server) commandLocked(r *http.Request) (*command, *httpError) {
	sb, err := s.lookupLocked(r)
	if err != nil {
		return nil, err
	}
	cid := r.PathValue("cid")
	cmd, ok := sb.cmds[cid]
	if !ok {
		return nil, notFound("command %s not found in sandbox %s", cid, sb.spec.ID)
	}
	return cmd, nil
}

func (s *Server) listCommands(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, err := s.lookupLocked(r)
	if err != nil {
		fail(w, err)
		return
	}
	out := []corral.Command{}
	for _, id := range sb.cmdList {
		out = append(out, sb.cmds[id].view())
	}
	writeJSON(w, http.StatusOK, map[string]any{"commands": out})
}

func (s *Server) getCommand(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd, err := s.commandLocked(r)
	if err != nil {
		fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, cmd.view())
}

func (s *Server) output(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var offset int64
	if v := q.Get("offset"); v != "" {
		var err error
		if offset, err = strconv.ParseInt(v, 10, 64); err != nil || offset < 0 {
			fail(w, invalid("offset", "offset %q is not a byte offset", v))
			return
		}
	}
	follow := true // as on the real server
	if v := q.Get("follow"); v != "" {
		var err error
		if follow, err = strconv.ParseBool(v); err != nil {
			fail(w, invalid("follow", "follow %q is not true or false", v))
			return
		}
	}
	s.mu.Lock()
	cmd, err := s.commandLocked(r)
	s.mu.Unlock()
	if err != nil {
		fail(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	s.streamOutput(w, r, cmd, offset, follow)
}

func (s *Server) stdin(w http.ResponseWriter, r *http.Request) {
	eof := r.URL.Query().Get("eof") == "true"
	data, _ := io.ReadAll(r.Body) // already buffered by the recorder
	s.mu.Lock()
	cmd, herr := s.commandLocked(r)
	s.mu.Unlock()
	if herr != nil {
		fail(w, herr)
		return
	}
	if _, err := cmd.stdin.Write(data); err != nil {
		fail(w, conflict("stdin of command %s is closed", cmd.info.ID))
		return
	}
	if eof {
		cmd.stdin.CloseWithError(io.EOF)
	}
	w.WriteHeader(http.StatusNoContent)
}

// signalNames maps Linux signal numbers to names, for the signals clients commonly send.
var signalNames = map[int]string{
	1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 6: "SIGABRT", 9: "SIGKILL", 10: "SIGUSR1",
	12: "SIGUSR2", 13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM",
}

// signalName normalizes "TERM", "SIGTERM" or "15" to "SIGTERM".
func signalName(s string) (string, bool) {
	if n, err := strconv.Atoi(s); err == nil {
		name, ok := signalNames[n]
		return name, ok
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	for _, known := range signalNames {
		if known == name {
			return name, true
		}
	}
	return "", false
}

func (s *Server) signal(w http.ResponseWriter, r *http.Request) {
	var req corral.SignalRequest
	if err := decodeBody(r, &req); err != nil {
		fail(w, err)
		return
	}
	name, ok := signalName(req.Signal)
	if !ok {
		fail(w, invalid("signal", "unknown signal %q", req.Signal))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd, herr := s.commandLocked(r)
	if herr != nil {
		fail(w, herr)
		return
	}
	if cmd.info.Exit != nil {
		fail(w, conflict("command %s has exited", cmd.info.ID))
		return
	}
	if sb, herr := s.lookupLocked(r); herr == nil {
		if x := sb.exclusiveLocked(); x != nil && x != cmd {
			fail(w, conflict("an exclusive command (%s) is running in this sandbox; retry when it has ended", x.info.ID))
			return
		}
	}
	cmd.cancel(signalCause{name})
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) resize(w http.ResponseWriter, r *http.Request) {
	var req corral.ResizeRequest
	if err := decodeBody(r, &req); err != nil {
		fail(w, err)
		return
	}
	if req.Rows == 0 || req.Cols == 0 {
		fail(w, invalid("rows", "rows and cols must be positive"))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd, herr := s.commandLocked(r)
	if herr != nil {
		fail(w, herr)
		return
	}
	if !cmd.info.TTY {
		fail(w, conflict("command %s has no terminal", cmd.info.ID))
		return
	}
	select {
	case cmd.resizes <- req:
	default:
	}
	w.WriteHeader(http.StatusNoContent)
}
