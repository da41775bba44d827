package agentrpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Client talks to one agent through its socket. It dials a new connection per call, so it holds
// no state and is safe for concurrent use.
//
// Errors: a failure the agent reports keeps its errdefs kind (errors.Is(err, errdefs.ErrNotFound)
// for an unknown command id or a missing file, and so on) and its message; a failure to reach the
// agent or a connection lost mid-call is errdefs.ErrUnavailable; a canceled ctx returns ctx.Err()
// (wrapped).
type Client struct {
	path   string
	dialer net.Dialer
}

// NewClient returns a client for the agent listening at socketPath.
func NewClient(socketPath string) *Client {
	return &Client{path: socketPath}
}

// clientConn is one call's connection. ctx cancellation closes it.
type clientConn struct {
	ctx  context.Context
	op   string
	nc   net.Conn
	f    *framer
	stop func() bool
}

func (c *Client) dial(ctx context.Context, req *request) (*clientConn, error) {
	nc, err := dialNoFollow(ctx, &c.dialer, c.path)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("agent %s: %w", req.Op, ctx.Err())
		}
		return nil, fmt.Errorf("agent %s: dial %s: %v: %w", req.Op, c.path, err, errdefs.ErrUnavailable)
	}
	cc := &clientConn{ctx: ctx, op: req.Op, nc: nc, f: newFramer(nc)}
	cc.stop = context.AfterFunc(ctx, func() { nc.Close() })
	if err := cc.f.writeJSON(frameRequest, req); err != nil {
		cc.close()
		if errors.Is(err, errProtocol) {
			return nil, fmt.Errorf("agent %s: request larger than %d bytes (stdin of Start is limited to %d bytes: use KeepStdinOpen and WriteStdin): %w",
				req.Op, maxFramePayload, maxInlineStdin, errdefs.ErrTooLarge)
		}
		return nil, fmt.Errorf("agent %s: encode request: %w", req.Op, err)
	}
	return cc, nil
}

func (cc *clientConn) close() error {
	cc.stop()
	return cc.nc.Close()
}

// fail turns a local failure (I/O, protocol) into the error the caller sees.
func (cc *clientConn) fail(err error) error {
	var re *remoteError
	switch {
	case cc.ctx.Err() != nil:
		return fmt.Errorf("agent %s: %w", cc.op, cc.ctx.Err())
	case errors.As(err, &re), errdefs.Field(err) != "":
		return err
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("agent %s: connection closed by the agent: %w", cc.op, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("agent %s: %v: %w", cc.op, err, errdefs.ErrUnavailable)
}

// readReply reads the reply frame (or the error frame) that answers a request.
func (cc *clientConn) readReply() (reply, error) {
	typ, payload, err := cc.f.readFrame()
	if err != nil {
		return reply{}, cc.fail(err)
	}
	switch typ {
	case frameReply:
		var r reply
		if err := json.Unmarshal(payload, &r); err != nil {
			return reply{}, cc.fail(fmt.Errorf("decode reply: %v: %w", err, errProtocol))
		}
		return r, nil
	case frameError:
		return reply{}, decodeError(payload)
	}
	return reply{}, cc.fail(fmt.Errorf("unexpected frame %q: %w", typ, errProtocol))
}

// roundTrip sends req and returns the agent's single reply.
func (c *Client) roundTrip(ctx context.Context, req *request) (reply, error) {
	cc, err := c.dial(ctx, req)
	if err != nil {
		return reply{}, err
	}
	defer cc.close()
	if err := cc.f.flush(); err != nil {
		return reply{}, cc.fail(err)
	}
	return cc.readReply()
}

// upload sends req followed by r as a data stream and returns the agent's reply. When the agent
// gives up early (it answers with an error frame and hangs up), that error is returned.
func (c *Client) upload(ctx context.Context, req *request, r io.Reader) (reply, error) {
	cc, err := c.dial(ctx, req)
	if err != nil {
		return reply{}, err
	}
	defer cc.close()
	buf := make([]byte, dataChunk)
	var werr error
	for werr == nil {
		n, rerr := r.Read(buf)
		if n > 0 {
			werr = cc.f.writeFrame(frameData, nil, buf[:n])
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			// Hanging up without an end frame makes the agent discard what it received.
			return reply{}, fmt.Errorf("agent %s: read input: %w", req.Op, rerr)
		}
	}
	if werr == nil {
		werr = dataWriter{cc.f}.Close()
	}
	rep, err := cc.readReply()
	if err != nil && werr != nil && !isRemote(err) {
		return reply{}, cc.fail(werr)
	}
	return rep, err
}

func isRemote(err error) bool {
	var re *remoteError
	return errors.As(err, &re) || errdefs.Field(err) != ""
}

// Ping returns the agent's description of itself.
func (c *Client) Ping(ctx context.Context) (Info, error) {
	r, err := c.roundTrip(ctx, &request{Op: opPing})
	if err != nil {
		return Info{}, err
	}
	if r.Info == nil {
		return Info{}, fmt.Errorf("agent ping: empty reply: %w", errdefs.ErrUnavailable)
	}
	return *r.Info, nil
}

// Exec starts a command and streams its output on the same connection. It returns once the agent
// has started the command (or recorded that it could not: the stream then holds only an exit
// event with Exit.Error). ctx bounds the whole session; when it ends or the session is closed, the
// stream ends and the command keeps running (reach it again with Attach).
//
// Stdin beyond 512 KiB is not sent in the request but streamed on the session, so its size is
// not limited.
func (c *Client) Exec(ctx context.Context, req ExecRequest) (*Session, error) {
	var stream []byte // stdin to stream after the request
	keep := req.KeepStdinOpen
	if len(req.Stdin) > maxInlineStdin {
		stream, req.Stdin, req.KeepStdinOpen = req.Stdin, nil, true
	}
	cc, err := c.dial(ctx, &request{Op: opExec, Exec: &req})
	if err != nil {
		return nil, err
	}
	if err := cc.f.flush(); err != nil {
		cc.close()
		return nil, cc.fail(err)
	}
	r, err := cc.readReply()
	if err != nil {
		cc.close()
		return nil, err
	}
	if r.Command == nil {
		cc.close()
		return nil, cc.fail(fmt.Errorf("exec reply without command: %w", errProtocol))
	}
	s := &Session{events: eventStream{cc: cc, info: *r.Command}}
	if req.KeepStdinOpen {
		s.stdin = &sessionStdin{cc: cc}
	}
	if stream != nil && s.Info().State == CommandRunning {
		// Written in the background (the command may read it slowly), ahead of anything written
		// through Stdin: the lock is taken before Exec returns.
		w := s.stdin
		w.mu.Lock()
		go func() { // ends when written or when the session's connection closes
			defer w.mu.Unlock()
			if err := w.writeLocked(stream); err == nil && !keep {
				w.closeLocked()
			}
		}()
		if !keep {
			s.stdin = nil
		}
	}
	return s, nil
}

// maxInlineStdin is the most ExecRequest.Stdin a request carries; Exec streams more on the
// session, Start refuses more.
const maxInlineStdin = 512 << 10

// Start starts a command in the background and returns at once. Its output is kept by the agent
// (see Attach); a command that could not start is returned as exited, with Exit.Error. Stdin is
// limited to 512 KiB (ErrTooLarge): send more with KeepStdinOpen and WriteStdin.
func (c *Client) Start(ctx context.Context, req ExecRequest) (CommandInfo, error) {
	if len(req.Stdin) > maxInlineStdin {
		return CommandInfo{}, fmt.Errorf("agent start: stdin of %d bytes exceeds %d: use KeepStdinOpen and WriteStdin: %w", len(req.Stdin), maxInlineStdin, errdefs.ErrTooLarge)
	}
	r, err := c.roundTrip(ctx, &request{Op: opStart, Exec: &req})
	if err != nil {
		return CommandInfo{}, err
	}
	if r.Command == nil {
		return CommandInfo{}, fmt.Errorf("agent start: reply without command: %w", errdefs.ErrUnavailable)
	}
	return *r.Command, nil
}

// Attach streams a command's output from offset: first an EventTruncated (with Dropped) when
// output before the kept range [OutputStart, OutputEnd) was asked for, then the kept output, then,
// with follow, live output; the stream ends with EventExit once the command has exited, or, without
// follow, at the current end while it still runs. offset beyond OutputEnd is ErrInvalid; an
// unknown (or forgotten) id is ErrNotFound. ctx bounds the stream.
func (c *Client) Attach(ctx context.Context, id string, offset int64, follow bool) (*Stream, error) {
	cc, err := c.dial(ctx, &request{Op: opAttach, ID: id, Offset: offset, Follow: follow})
	if err != nil {
		return nil, err
	}
	if err := cc.f.flush(); err != nil {
		cc.close()
		return nil, cc.fail(err)
	}
	r, err := cc.readReply()
	if err != nil {
		cc.close()
		return nil, err
	}
	if r.Command == nil {
		cc.close()
		return nil, cc.fail(fmt.Errorf("attach reply without command: %w", errProtocol))
	}
	return &Stream{events: eventStream{cc: cc, info: *r.Command}}, nil
}

// WriteStdin writes r to a command's stdin (stdin must still be open: ErrConflict otherwise) and,
// with closeAfter, closes it. On a terminal closing is a no-op: send ^D.
func (c *Client) WriteStdin(ctx context.Context, id string, r io.Reader, closeAfter bool) error {
	_, err := c.upload(ctx, &request{Op: opStdin, ID: id, Close: closeAfter}, r)
	return err
}

// Signal sends sig to a command's process group. ErrConflict once the command has exited.
func (c *Client) Signal(ctx context.Context, id string, sig syscall.Signal) error {
	_, err := c.roundTrip(ctx, &request{Op: opSignal, ID: id, Signal: int(sig)})
	return err
}

// SetHostname sets the sandbox's hostname: once, on a microvm's agent started with
// ClaimableFlag (a VM of a warm pool, at its claim); any other agent refuses it (ErrInvalid).
func (c *Client) SetHostname(ctx context.Context, name string) error {
	_, err := c.roundTrip(ctx, &request{Op: opHostname, Hostname: name})
	return err
}

// Resize changes the terminal size of a TTY command (ErrInvalid for a command without one).
func (c *Client) Resize(ctx context.Context, id string, rows, cols uint16) error {
	_, err := c.roundTrip(ctx, &request{Op: opResize, ID: id, Rows: rows, Cols: cols})
	return err
}

// Command describes one command, running or exited and still kept.
func (c *Client) Command(ctx context.Context, id string) (CommandInfo, error) {
	r, err := c.roundTrip(ctx, &request{Op: opCommand, ID: id})
	if err != nil {
		return CommandInfo{}, err
	}
	if r.Command == nil {
		return CommandInfo{}, fmt.Errorf("agent command: reply without command: %w", errdefs.ErrUnavailable)
	}
	return *r.Command, nil
}

// Commands lists the running commands and the exited ones still kept, oldest first.
func (c *Client) Commands(ctx context.Context) ([]CommandInfo, error) {
	r, err := c.roundTrip(ctx, &request{Op: opCommands})
	if err != nil {
		return nil, err
	}
	return r.Commands, nil
}

// ReadFile streams the regular file at path. The reader returns the agent's error if reading
// fails midway; closing it early hangs up. ctx bounds the whole read.
func (c *Client) ReadFile(ctx context.Context, path string) (io.ReadCloser, FileInfo, error) {
	cc, r, err := c.download(ctx, &request{Op: opRead, Path: path})
	if err != nil {
		return nil, FileInfo{}, err
	}
	if r.File == nil {
		cc.close()
		return nil, FileInfo{}, cc.fail(fmt.Errorf("read reply without file: %w", errProtocol))
	}
	return &downloadReader{cc: cc, data: dataReader{f: cc.f}}, *r.File, nil
}

// TarOut streams a tar archive of the file or directory tree at path, with names relative to
// path (a file appears under its base name). Other filesystems mounted beneath path are not
// descended into; devices, FIFOs and sockets are left out.
func (c *Client) TarOut(ctx context.Context, path string) (io.ReadCloser, error) {
	cc, _, err := c.download(ctx, &request{Op: opTarOut, Path: path})
	if err != nil {
		return nil, err
	}
	return &downloadReader{cc: cc, data: dataReader{f: cc.f}}, nil
}

func (c *Client) download(ctx context.Context, req *request) (*clientConn, reply, error) {
	cc, err := c.dial(ctx, req)
	if err != nil {
		return nil, reply{}, err
	}
	if err := cc.f.flush(); err != nil {
		cc.close()
		return nil, reply{}, cc.fail(err)
	}
	r, err := cc.readReply()
	if err != nil {
		cc.close()
		return nil, reply{}, err
	}
	return cc, r, nil
}

// downloadReader reads a data stream from the agent.
type downloadReader struct {
	cc   *clientConn
	data dataReader
}

func (d *downloadReader) Read(p []byte) (int, error) {
	n, err := d.data.Read(p)
	if err != nil && err != io.EOF && !isRemote(err) {
		err = d.cc.fail(err)
	}
	return n, err
}

func (d *downloadReader) Close() error {
	d.cc.close()
	return nil
}

// WriteFile stores r at path, streamed: into a temporary file in the same directory that
// replaces path once r is complete (readers never see a partial file; a symbolic link at path is
// replaced, not followed), or appended with opts.Append. A failure of r leaves path untouched.
// Missing parent directories are ErrNotFound unless opts.Parents.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader, opts WriteOptions) (FileInfo, error) {
	rep, err := c.upload(ctx, &request{Op: opWrite, Path: path, Write: &opts}, r)
	if err != nil {
		return FileInfo{}, err
	}
	if rep.File == nil {
		return FileInfo{}, fmt.Errorf("agent write: reply without file: %w", errdefs.ErrUnavailable)
	}
	return *rep.File, nil
}

// Stat describes path itself (a symbolic link is not followed).
func (c *Client) Stat(ctx context.Context, path string) (FileInfo, error) {
	r, err := c.roundTrip(ctx, &request{Op: opStat, Path: path})
	if err != nil {
		return FileInfo{}, err
	}
	if r.File == nil {
		return FileInfo{}, fmt.Errorf("agent stat: reply without file: %w", errdefs.ErrUnavailable)
	}
	return *r.File, nil
}

// List returns the entries of the directory dir, sorted by name (symbolic links not followed).
func (c *Client) List(ctx context.Context, dir string) ([]FileInfo, error) {
	cc, err := c.dial(ctx, &request{Op: opList, Path: dir})
	if err != nil {
		return nil, err
	}
	defer cc.close()
	if err := cc.f.flush(); err != nil {
		return nil, cc.fail(err)
	}
	var out []FileInfo
	for {
		typ, payload, err := cc.f.readFrame()
		if err != nil {
			return nil, cc.fail(err)
		}
		switch typ {
		case frameReply:
			var r reply
			if err := json.Unmarshal(payload, &r); err != nil {
				return nil, cc.fail(fmt.Errorf("decode list: %v: %w", err, errProtocol))
			}
			out = append(out, r.Files...)
		case frameEnd:
			slices.SortFunc(out, func(a, b FileInfo) int { return strings.Compare(a.Name, b.Name) })
			return out, nil
		case frameError:
			return nil, decodeError(payload)
		default:
			return nil, cc.fail(fmt.Errorf("unexpected frame %q in list: %w", typ, errProtocol))
		}
	}
}

// Mkdir creates the directory path (mode default 0755); with opts.Parents also its missing
// parents, and an existing directory is then fine. Without Parents an existing path is
// ErrConflict and a missing parent ErrNotFound.
func (c *Client) Mkdir(ctx context.Context, path string, opts WriteOptions) (FileInfo, error) {
	r, err := c.roundTrip(ctx, &request{Op: opMkdir, Path: path, Write: &opts})
	if err != nil {
		return FileInfo{}, err
	}
	if r.File == nil {
		return FileInfo{}, fmt.Errorf("agent mkdir: reply without file: %w", errdefs.ErrUnavailable)
	}
	return *r.File, nil
}

// Remove deletes path (a symbolic link itself, not its target). A non-empty directory needs
// recursive (ErrConflict otherwise); a missing path is ErrNotFound.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	_, err := c.roundTrip(ctx, &request{Op: opRemove, Path: path, Recursive: recursive})
	return err
}

// Move renames source to destination inside the sandbox as rename(2) does (a file, or an empty
// directory, at destination is replaced) and describes destination afterwards. Both paths are
// resolved inside the agent's root, following symbolic links up to their last component but
// never through /proc's per-process links. A missing source or destination parent is
// ErrNotFound; paths on two different mounts are ErrInvalid (a move never copies); a
// non-empty directory at destination, or a directory and a non-directory, is ErrConflict.
func (c *Client) Move(ctx context.Context, source, destination string) (FileInfo, error) {
	r, err := c.roundTrip(ctx, &request{Op: opMove, Path: source, Dest: destination})
	if err != nil {
		return FileInfo{}, err
	}
	if r.File == nil {
		return FileInfo{}, fmt.Errorf("agent move: reply without file: %w", errdefs.ErrUnavailable)
	}
	return *r.File, nil
}

// Watch watches the directory dir (with recursive, every directory below it too, including
// those made later) and returns once the watch is in place: every change after that is reported
// by Next. A missing dir is ErrNotFound, a non-directory ErrInvalid; the agent's limits (watches
// at once, directories per watch) are ErrExhausted. ctx bounds the whole watch.
func (c *Client) Watch(ctx context.Context, dir string, recursive bool) (*Watch, error) {
	cc, _, err := c.download(ctx, &request{Op: opWatch, Path: dir, Recursive: recursive})
	if err != nil {
		return nil, err
	}
	return &Watch{cc: cc}, nil
}

// Watch is an open watch of a directory tree. It is not safe for concurrent use, except that
// Close may be called from any goroutine to end a blocked Next.
type Watch struct {
	cc      *clientConn
	pending []WatchEvent
	err     error // sticky: what Next returns once pending is empty
}

// Next returns the next event. After the watched directory went away (the last event is its
// remove or rename, with an empty Name) it returns io.EOF; a watch the agent ended with an
// error (the tree outgrew the directory limit) returns that error.
func (w *Watch) Next() (WatchEvent, error) {
	for len(w.pending) == 0 {
		if w.err != nil {
			return WatchEvent{}, w.err
		}
		typ, payload, err := w.cc.f.readFrame()
		switch {
		case err != nil:
			w.err = w.cc.fail(err)
		case typ == frameReply:
			var r reply
			if err := json.Unmarshal(payload, &r); err != nil {
				w.err = w.cc.fail(fmt.Errorf("decode watch events: %v: %w", err, errProtocol))
			}
			w.pending = r.Events
		case typ == frameEnd:
			w.err = io.EOF
		case typ == frameError:
			w.err = decodeError(payload)
		default:
			w.err = w.cc.fail(fmt.Errorf("unexpected frame %q in watch: %w", typ, errProtocol))
		}
	}
	ev := w.pending[0]
	w.pending = w.pending[1:]
	return ev, nil
}

// Close ends the watch.
func (w *Watch) Close() error { return w.cc.close() }

// TarIn extracts the tar archive read from r into the directory dir (created with opts.Parents;
// ErrNotFound otherwise when missing). Entries that would escape dir (absolute names, "..",
// paths through a symbolic link, including one the archive created) and device nodes are
// rejected with ErrInvalid naming the entry; an archive beyond the agent's size or entry limit is
// ErrTooLarge. Extraction stops at the first rejected entry; earlier entries stay. Ownership in
// the archive is ignored: everything belongs to opts.User (default root); opts.Mode is unused.
func (c *Client) TarIn(ctx context.Context, dir string, r io.Reader, opts WriteOptions) error {
	_, err := c.upload(ctx, &request{Op: opTarIn, Path: dir, Write: &opts}, r)
	return err
}

// CallPrep prepares the call id (1-64 of [a-z0-9-]) in an agent started with --calls: a fresh
// tmpfs of sizeBytes holds everything the call will write. It returns the call's directory dir:
// write the call's input files under dir+"/upper" (WriteFile, Mkdir, TarIn; they appear at the
// same path without the prefix inside the call), run its command with ExecRequest.Call set to
// CallSpec{Dir: dir}, read what it wrote under dir+"/upper", then CallEnd. An id already prepared
// and not ended is ErrConflict; an agent without --calls answers ErrInvalid.
func (c *Client) CallPrep(ctx context.Context, id string, sizeBytes int64) (dir string, err error) {
	r, err := c.roundTrip(ctx, &request{Op: opCallPrep, ID: id, Size: sizeBytes})
	if err != nil {
		return "", err
	}
	if r.Dir == "" {
		return "", fmt.Errorf("agent callprep: reply without dir: %w", errdefs.ErrUnavailable)
	}
	return r.Dir, nil
}

// CallEnd ends the call id: its command is killed if it still runs, everything it wrote goes
// away, and the agent checks that nothing of it is left in the container. An error means the
// request failed (ErrNotFound: no such call); CallEnd.Clean false means the call was ended but
// the container is not fit for another call.
func (c *Client) CallEnd(ctx context.Context, id string) (CallEnd, error) {
	r, err := c.roundTrip(ctx, &request{Op: opCallEnd, ID: id})
	if err != nil {
		return CallEnd{}, err
	}
	if r.CallEnd == nil {
		return CallEnd{}, fmt.Errorf("agent callend: reply without result: %w", errdefs.ErrUnavailable)
	}
	return *r.CallEnd, nil
}

// eventStream reads the output frames of an exec or attach connection.
type eventStream struct {
	cc   *clientConn
	info CommandInfo
	done bool // the exit event (or the end of a non-following attach) was read
}

func (e *eventStream) next() (Event, error) {
	if e.done {
		return Event{}, io.EOF
	}
	typ, payload, err := e.cc.f.readFrame()
	if err != nil {
		if err == io.EOF && e.cc.ctx.Err() == nil {
			return Event{}, fmt.Errorf("agent %s: stream of %s ended before the command exited: %w", e.cc.op, e.info.ID, errdefs.ErrUnavailable)
		}
		return Event{}, e.cc.fail(err)
	}
	switch typ {
	case frameEnd:
		e.done = true
		return Event{}, io.EOF
	case frameError:
		e.done = true
		return Event{}, decodeError(payload)
	}
	ev, err := decodeEvent(typ, payload)
	if err != nil {
		return Event{}, e.cc.fail(err)
	}
	if ev.Type == EventExit {
		e.done = true
	}
	return ev, nil
}

// Stream is the output of a command read through Attach. It is not safe for concurrent use.
type Stream struct {
	events eventStream
}

// Info describes the command as it was when the stream began.
func (s *Stream) Info() CommandInfo { return s.events.info }

// Next returns the next event; io.EOF after the EventExit or, without follow, once the output
// the command had produced is sent.
func (s *Stream) Next() (Event, error) { return s.events.next() }

// Close hangs up. The command is not affected.
func (s *Stream) Close() error { return s.events.cc.close() }

// Session is a command started by Exec, with its output stream and, when the request kept it
// open, its stdin. Next is for one goroutine; Stdin may be written from another.
type Session struct {
	events eventStream
	stdin  *sessionStdin
}

// Info describes the command as it was just after it started: ID and Pid, or, when it could not
// start, State exited and Exit.Error.
func (s *Session) Info() CommandInfo { return s.events.info }

// Next returns the next event: stdout, stderr and truncated events as the command produces them,
// then EventExit; after it, io.EOF.
func (s *Session) Next() (Event, error) { return s.events.next() }

// Stdin returns the command's stdin when the request set KeepStdinOpen, or nil. Each Write is sent
// at once; Close closes the command's stdin (on a terminal: no-op, send ^D).
func (s *Session) Stdin() io.WriteCloser {
	if s.stdin == nil {
		return nil
	}
	return s.stdin
}

// CallEnd returns what the agent found when it ended the call of a command started with
// CallSpec.End, once Next has returned the exit event. An error means the result did not come
// (the connection was lost, or the agent could not end the call): end it with Client.CallEnd,
// which answers ErrNotFound when the agent did end it.
func (s *Session) CallEnd() (CallEnd, error) {
	if !s.events.done {
		return CallEnd{}, fmt.Errorf("agent %s: the call's end is read after the exit event: %w", s.events.cc.op, errdefs.ErrConflict)
	}
	r, err := s.events.cc.readReply()
	if err != nil {
		return CallEnd{}, err
	}
	if r.CallEnd == nil {
		return CallEnd{}, fmt.Errorf("agent %s: reply without the call's end: %w", s.events.cc.op, errdefs.ErrUnavailable)
	}
	return *r.CallEnd, nil
}

// Close hangs up. The command keeps running; its stdin stays open when it was kept open.
func (s *Session) Close() error { return s.events.cc.close() }

// sessionStdin writes stdin frames on an exec connection.
type sessionStdin struct {
	cc     *clientConn
	mu     sync.Mutex
	closed bool // protected by mu
}

func (w *sessionStdin) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.writeLocked(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// writeLocked sends p. Preconditions: w.mu held.
func (w *sessionStdin) writeLocked(p []byte) error {
	if w.closed {
		return fmt.Errorf("agent exec: stdin already closed: %w", errdefs.ErrConflict)
	}
	_, err := dataWriter{w.cc.f}.Write(p)
	if err == nil {
		err = w.cc.f.flush()
	}
	if err != nil {
		return w.cc.fail(err)
	}
	return nil
}

func (w *sessionStdin) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closeLocked()
}

// closeLocked sends the end of stdin. Preconditions: w.mu held.
func (w *sessionStdin) closeLocked() error {
	if w.closed {
		return nil
	}
	w.closed = true
	if err := (dataWriter{w.cc.f}).Close(); err != nil {
		return w.cc.fail(err)
	}
	return nil
}

// dialNoFollow connects to the unix socket at path without following a symlink in its last
// component: on gVisor the socket lives in a directory the sandbox can write, and a symlink
// planted there must not turn the edge into a client of some other socket on the host.
func dialNoFollow(ctx context.Context, d *net.Dialer, path string) (net.Conn, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("%s is not a socket", path)
	}
	return d.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
}
