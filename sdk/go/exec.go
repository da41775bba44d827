package corral

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
)

// Event types in an output stream.
const (
	EventStart     = "start"
	EventStdout    = "stdout"
	EventStderr    = "stderr"
	EventTruncated = "truncated"
	EventExit      = "exit"
	// EventError is sent by the server, instead of an exit, when it lost the command's output
	// stream; Data holds its message. [Stream.Next] turns it into an error.
	EventError = "error"
)

// ErrStreamClosed is returned by [Stream.Next] after [Stream.Close].
var ErrStreamClosed = errors.New("corral: stream closed")

// Stream is the output of one command as a sequence of events, read with [Stream.Next] or
// drained with [Stream.Copy]. The caller must Close it.
//
// A Stream is not safe for concurrent use, except that Close may be called from any goroutine
// to abort a blocked Next. Closing a stream does not stop the command; use [Client.Signal].
type Stream struct {
	body io.ReadCloser
	dec  *json.Decoder
	// stdin and stdinW are the two sides of the pipe feeding a full-duplex request body, or nil.
	stdin  *io.PipeReader
	stdinW *io.PipeWriter
	// wantExit says the stream must end with an exit event; ending without one is an error.
	wantExit bool

	pending   *Event // the first event, read early by Exec to learn the command ID
	commandID string
	exit      *Exit
	result    *CallResult // a call's result, carried by its stream's exit event
	dropped   int64
	err       error // sticky: once set, Next returns it

	closed    atomic.Bool // set by Close, which may run on another goroutine
	closeOnce sync.Once
}

func newStream(body io.ReadCloser, wantExit bool) *Stream {
	return &Stream{body: body, dec: json.NewDecoder(body), wantExit: wantExit}
}

// CommandID returns the ID of the command whose output this is. For a stream from Exec it is
// known as soon as Exec returns, unless the command failed to start.
func (s *Stream) CommandID() string { return s.commandID }

// Exit returns how the command ended, once Next has returned the exit event; nil before that
// and for streams that end while the command is still running (Attach without follow).
func (s *Stream) Exit() *Exit { return s.exit }

// Result returns a call's result (CallStream) once Next has returned the exit event; nil before
// that and for command streams. Its Stdout and Stderr are empty: they came as events.
func (s *Stream) Result() *CallResult { return s.result }

// Dropped returns how many output bytes the server reported lost so far ("truncated" events),
// because they exceeded the sandbox's output limit.
func (s *Stream) Dropped() int64 { return s.dropped }

// Next returns the next event. After the exit event it returns io.EOF; a stream that ends
// without an exit event returns io.EOF when that is expected (Attach without follow) and an
// error wrapping io.ErrUnexpectedEOF otherwise. An "error" event from the server becomes an
// error. Events of types this package does not know are returned as they are.
func (s *Stream) Next() (Event, error) {
	if s.pending != nil {
		ev := *s.pending
		s.pending = nil
		return ev, nil
	}
	if s.err != nil {
		return Event{}, s.err
	}
	ev, err := s.read()
	if err != nil {
		s.err = err
		return Event{}, err
	}
	return ev, nil
}

// read decodes one event and records what it says about the command.
func (s *Stream) read() (Event, error) {
	if s.exit != nil {
		return Event{}, io.EOF
	}
	var ev Event
	if err := s.dec.Decode(&ev); err != nil {
		switch {
		case s.closed.Load():
			return Event{}, ErrStreamClosed
		case errors.Is(err, io.EOF) && !s.wantExit:
			return Event{}, io.EOF
		case errors.Is(err, io.EOF):
			return Event{}, fmt.Errorf("output stream ended before the command exited: %w", io.ErrUnexpectedEOF)
		}
		return Event{}, fmt.Errorf("read output stream: %w", err)
	}
	switch ev.Type {
	case EventStart:
		if ev.CommandID != "" {
			s.commandID = ev.CommandID
		}
	case EventTruncated:
		s.dropped += ev.Dropped
	case EventExit:
		if ev.Exit == nil {
			ev.Exit = &Exit{}
		}
		s.exit, s.result = ev.Exit, ev.Result
		if s.stdinW != nil {
			// Nothing more will be read: end the request body cleanly, so the server need
			// not cut it short (which can break the connection under the response).
			s.stdinW.Close()
		}
	case EventError:
		return Event{}, fmt.Errorf("output stream failed on the server: %s", ev.Data)
	}
	return ev, nil
}

// Close ends the stream: it closes the response and stops sending stdin. The command keeps
// running. Close is safe to call more than once and from another goroutine.
func (s *Stream) Close() error {
	s.closeOnce.Do(s.closeNow)
	return nil
}

func (s *Stream) closeNow() {
	s.closed.Store(true)
	if s.stdin != nil {
		s.stdin.CloseWithError(ErrStreamClosed)
	} else if s.exit != nil {
		// The server ends the response right after the exit event: read that end, so the
		// connection goes back to the pool instead of being torn down and dialled again.
		io.CopyN(io.Discard, s.body, 64<<10)
	}
	s.body.Close()
}

// Copy writes the output of the stream to stdout and stderr until the stream ends and returns
// how the command ended (nil if the stream ended while it was still running). A nil writer
// discards that stream. Copy does not close the stream.
func (s *Stream) Copy(stdout, stderr io.Writer) (*Exit, error) {
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			return s.exit, nil
		}
		if err != nil {
			return nil, err
		}
		var w io.Writer
		switch ev.Type {
		case EventStdout:
			w = stdout
		case EventStderr:
			w = stderr
		}
		if w != nil && len(ev.Data) > 0 {
			if _, err := w.Write(ev.Data); err != nil {
				return nil, fmt.Errorf("write %s: %w", ev.Type, err)
			}
		}
	}
}

// Exec runs a command in the sandbox and streams its output. The command's stdin is
// req.Stdin, then end of file.
//
// A command the server cannot start (no such program, a bad cwd or user) is an error that
// [IsInvalid] recognizes, whose [APIError.Field] is "argv", "cwd" or "user". A command that
// starts but cannot run (not executable) streams "start" and then an "exit" whose Error says
// why. Otherwise the stream is "start", output, and "exit".
func (c *Client) Exec(ctx context.Context, id string, req ExecRequest) (*Stream, error) {
	resp, err := c.send(ctx, request{
		method: http.MethodPost,
		path:   sandboxPath(id, "exec"),
		json:   req,
	})
	if err != nil {
		return nil, err
	}
	return startStream(resp.Body, nil, nil)
}

// ExecStream is Exec with the command's stdin fed from stdin while the output streams back,
// in one full-duplex request. End of file on stdin closes the command's stdin; req.Stdin must
// be empty.
//
// A goroutine copies stdin into the request. It ends when stdin returns EOF or an error, or,
// once the command has exited or the stream is closed, when its pending Read returns (a Read
// blocked on a terminal cannot be interrupted; its data is then discarded). stdin is never
// closed.
func (c *Client) ExecStream(ctx context.Context, id string, req ExecRequest, stdin io.Reader) (*Stream, error) {
	if len(req.Stdin) > 0 {
		return nil, errors.New("exec: ExecRequest.Stdin must be empty when stdin is streamed")
	}
	head, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	head = append(head, '\n')
	pr, pw := io.Pipe()
	go func() {
		if _, err := pw.Write(head); err != nil {
			pw.CloseWithError(err)
			return
		}
		_, err := io.Copy(pw, stdin)
		pw.CloseWithError(err) // nil closes with io.EOF: the command's stdin ends.
	}()
	resp, err := c.send(ctx, request{
		method:      http.MethodPost,
		path:        sandboxPath(id, "exec"),
		query:       url.Values{"stdin": {"stream"}},
		body:        pr,
		contentType: "application/octet-stream",
		// When the command exits first, the server abandons the rest of the body mid-read;
		// the connection's framing is then unknown, so it must not carry another request.
		closeConn: true,
	})
	if err != nil {
		pr.CloseWithError(ErrStreamClosed)
		return nil, err
	}
	return startStream(resp.Body, pr, pw)
}

// startStream wraps an exec response and reads its first event, which names the command.
func startStream(body io.ReadCloser, stdin *io.PipeReader, stdinW *io.PipeWriter) (*Stream, error) {
	s := newStream(body, true)
	s.stdin, s.stdinW = stdin, stdinW
	ev, err := s.read()
	if err != nil {
		s.Close()
		return nil, err
	}
	s.pending = &ev
	return s, nil
}

// Run runs a command to completion and returns its collected output and how it ended. A
// command that ran and exited non-zero is not an error: check exit.
func (c *Client) Run(ctx context.Context, id string, req ExecRequest) (stdout, stderr []byte, exit *Exit, err error) {
	s, err := c.Exec(ctx, id, req)
	if err != nil {
		return nil, nil, nil, err
	}
	defer s.Close()
	var outBuf, errBuf bytes.Buffer
	exit, err = s.Copy(&outBuf, &errBuf)
	return outBuf.Bytes(), errBuf.Bytes(), exit, err
}

// StartCommand starts a command in the background and returns it without waiting. Read its
// output with [Client.Attach]; feed its stdin with [Client.WriteStdin].
func (c *Client) StartCommand(ctx context.Context, id string, req ExecRequest) (*Command, error) {
	var out Command
	err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "commands"), json: req}, &out)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// Commands lists the commands of a sandbox, running and exited.
func (c *Client) Commands(ctx context.Context, id string) ([]Command, error) {
	var out struct {
		Commands []Command `json:"commands"`
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id, "commands")}, &out); err != nil {
		return nil, err
	}
	return out.Commands, nil
}

// Command returns one command of a sandbox.
func (c *Client) Command(ctx context.Context, id, cid string) (*Command, error) {
	var out Command
	if err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id, "commands", cid)}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Attach streams a command's output from byte offset (stdout and stderr counted together; 0
// is the start of what the server still holds). With follow, the stream continues until the
// command exits and ends with the exit event; without, it ends at the output produced so far,
// with the exit event only if the command has already exited. Attach streams have no start
// event.
func (c *Client) Attach(ctx context.Context, id, cid string, offset int64, follow bool) (*Stream, error) {
	q := url.Values{
		"offset": {strconv.FormatInt(offset, 10)},
		"follow": {strconv.FormatBool(follow)},
	}
	resp, err := c.send(ctx, request{
		method: http.MethodGet,
		path:   sandboxPath(id, "commands", cid, "output"),
		query:  q,
	})
	if err != nil {
		return nil, err
	}
	s := newStream(resp.Body, follow)
	s.commandID = cid
	return s, nil
}

// WriteStdin sends everything r yields to a background command's stdin; eof then closes it.
func (c *Client) WriteStdin(ctx context.Context, id, cid string, r io.Reader, eof bool) error {
	return c.do(ctx, request{
		method:      http.MethodPost,
		path:        sandboxPath(id, "commands", cid, "stdin"),
		query:       url.Values{"eof": {strconv.FormatBool(eof)}},
		body:        r,
		contentType: "application/octet-stream",
	}, nil)
}

// Signal sends a signal to a command: a name ("SIGTERM" or "TERM") or a number ("15").
func (c *Client) Signal(ctx context.Context, id, cid, signal string) error {
	return c.do(ctx, request{
		method: http.MethodPost,
		path:   sandboxPath(id, "commands", cid, "signal"),
		json:   SignalRequest{Signal: signal},
	}, nil)
}

// Resize sets the terminal size of a command started with a TTY.
func (c *Client) Resize(ctx context.Context, id, cid string, rows, cols uint16) error {
	return c.do(ctx, request{
		method: http.MethodPost,
		path:   sandboxPath(id, "commands", cid, "resize"),
		json:   ResizeRequest{Rows: rows, Cols: cols},
	}, nil)
}
