package agentrpc

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Wire format. Every message on a connection is a frame:
//
//	+--------+----------------------+-----------------+
//	| type 1 | payload length 4 (BE) | payload (<=1 MiB) |
//	+--------+----------------------+-----------------+
//
// A connection carries one exchange. The client sends a request frame (JSON request); the
// agent answers with a reply frame (JSON reply) or an error frame (JSON wireError), after which,
// depending on the operation, a stream follows:
//
//   - exec, attach: output frames from the agent (stdout, stderr, truncated), ending with an exit
//     frame, or an end frame when attach without follow reaches the current end. During exec the
//     client may send data frames (stdin) and an end frame (close stdin); hanging up ends the
//     stream and leaves the command running.
//   - read, tarout: data frames from the agent, then an end frame (or an error frame).
//   - write, stdin, tarin: data frames from the client, then an end frame; the agent replies only
//     after the end frame (or sends an error frame early and hangs up).
//   - list: reply frames, each with a batch of entries, then an end frame.
//   - watch: a first reply frame once the watch is in place, then reply frames each with a batch
//     of events, as they happen, until an end frame (the watched directory is gone) or an error
//     frame; the client ends it by hanging up.
//
// Output frames carry the output offset as 8 bytes (BE) before the data, so stdout and stderr
// bytes are never copied through JSON on the hot path.
const (
	frameRequest   = 'Q' // client -> agent: JSON request
	frameReply     = 'R' // agent -> client: JSON reply
	frameError     = 'E' // agent -> client: JSON wireError; ends the exchange
	frameData      = 'D' // either way: raw bytes of a file, archive or stdin
	frameEnd       = 'Z' // either way: end of a data or event stream (empty payload)
	frameStdout    = '1' // agent -> client: offset(8) + bytes
	frameStderr    = '2' // agent -> client: offset(8) + bytes
	frameTruncated = 'T' // agent -> client: offset(8) + dropped(8)
	frameExit      = 'X' // agent -> client: offset(8) + JSON Exit

	frameHeaderLen = 5
	// maxFramePayload bounds what a reader accepts, so a corrupt or hostile peer cannot make the
	// other side allocate more than this per frame.
	maxFramePayload = 1 << 20
	// dataChunk is the largest data frame a writer produces.
	dataChunk = 32 << 10
)

// Operations (request.Op).
const (
	opPing     = "ping"
	opExec     = "exec"
	opStart    = "start"
	opAttach   = "attach"
	opStdin    = "stdin"
	opSignal   = "signal"
	opResize   = "resize"
	opCommand  = "command"
	opCommands = "commands"
	opRead     = "read"
	opWrite    = "write"
	opStat     = "stat"
	opList     = "list"
	opMkdir    = "mkdir"
	opRemove   = "remove"
	opMove     = "move"
	opWatch    = "watch"
	opTarOut   = "tarout"
	opTarIn    = "tarin"
	opCallPrep = "callprep"
	opCallEnd  = "callend"
	opDial     = "dial"
	opHostname = "hostname"
	// opForkIdentity gives a microvm restored from another's memory (a fork's copy) its own
	// network address, hostname and entropy (forkidentity.go).
	opForkIdentity = "forkidentity"
)

// request is the payload of a request frame; Op says which other fields matter.
type request struct {
	Op        string        `json:"op"`
	ID        string        `json:"id,omitempty"`
	Exec      *ExecRequest  `json:"exec,omitempty"`
	Offset    int64         `json:"offset,omitempty"`
	Follow    bool          `json:"follow,omitempty"`
	Signal    int           `json:"signal,omitempty"`
	Rows      uint16        `json:"rows,omitempty"`
	Cols      uint16        `json:"cols,omitempty"`
	Close     bool          `json:"close,omitempty"`
	Path      string        `json:"path,omitempty"`
	Dest      string        `json:"dest,omitempty"` // move: the destination
	Write     *WriteOptions `json:"write,omitempty"`
	Recursive bool          `json:"recursive,omitempty"`
	Size      int64         `json:"size,omitempty"` // callprep: bytes of the call's tmpfs
	Port      int           `json:"port,omitempty"` // dial
	Hostname  string        `json:"hostname,omitempty"`
	// Identity is forkidentity's: what the copy of a forked VM takes on.
	Identity *ForkIdentity `json:"identity,omitempty"`
}

// reply is the payload of a reply frame.
type reply struct {
	Info     *Info         `json:"info,omitempty"`
	Command  *CommandInfo  `json:"command,omitempty"`
	Commands []CommandInfo `json:"commands,omitempty"`
	File     *FileInfo     `json:"file,omitempty"`
	Files    []FileInfo    `json:"files,omitempty"`
	Events   []WatchEvent  `json:"events,omitempty"` // watch
	Dir      string        `json:"dir,omitempty"`    // callprep
	CallEnd  *CallEnd      `json:"call_end,omitempty"`
}

// wireError is the payload of an error frame: the errdefs code of the failure and its message.
type wireError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Field names the invalid field of an errdefs.Invalid error.
	Field string `json:"field,omitempty"`
}

// errProtocol reports a malformed frame or an unexpected frame type.
var errProtocol = errors.New("agentrpc: protocol error")

// framer reads and writes frames on one connection. Reads and writes may run in different
// goroutines, but each direction is used by one goroutine at a time.
type framer struct {
	r   *bufio.Reader
	w   *bufio.Writer
	hdr [frameHeaderLen]byte // write header scratch
	buf []byte               // read payload buffer, reused
}

// newFramer buffers small frames; data frames larger than the buffers bypass them, so the buffers
// stay small (they are allocated for every connection, on both ends).
func newFramer(rw io.ReadWriter) *framer {
	return &framer{r: bufio.NewReaderSize(rw, 4<<10), w: bufio.NewWriterSize(rw, 16<<10)}
}

// readFrame returns the next frame. payload is valid until the next call.
func (f *framer) readFrame() (typ byte, payload []byte, err error) {
	return readFrameInto(f.r, &f.buf)
}

// readFrameInto reads one frame from r, reusing *buf for the payload.
func readFrameInto(r io.Reader, buf *[]byte) (typ byte, payload []byte, err error) {
	var hdr [frameHeaderLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err // io.EOF at a frame boundary is a clean hang-up
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxFramePayload {
		return 0, nil, fmt.Errorf("frame of %d bytes exceeds %d: %w", n, maxFramePayload, errProtocol)
	}
	// Grow the buffer as the payload arrives, not to the length announced, so a header alone
	// cannot make the reader allocate a megabyte.
	p := (*buf)[:0]
	for len(p) < int(n) {
		c := min(int(n)-len(p), 64<<10)
		p = slices.Grow(p, c)
		if _, err := io.ReadFull(r, p[len(p):len(p)+c]); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			*buf = p
			return 0, nil, err
		}
		p = p[:len(p)+c]
	}
	*buf = p
	return hdr[0], p, nil
}

// writeFrame buffers one frame made of prefix followed by data; call flush to send it.
func (f *framer) writeFrame(typ byte, prefix, data []byte) error {
	n := len(prefix) + len(data)
	if n > maxFramePayload {
		return fmt.Errorf("frame of %d bytes exceeds %d: %w", n, maxFramePayload, errProtocol)
	}
	f.hdr[0] = typ
	binary.BigEndian.PutUint32(f.hdr[1:], uint32(n))
	f.w.Write(f.hdr[:])
	f.w.Write(prefix)
	_, err := f.w.Write(data) // bufio keeps the first error; flush reports it too
	return err
}

func (f *framer) writeJSON(typ byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return f.writeFrame(typ, nil, b)
}

func (f *framer) flush() error { return f.w.Flush() }

// writeError buffers an error frame describing err and flushes it.
func (f *framer) writeError(err error) error {
	we := wireError{Code: errdefs.Code(err), Message: err.Error(), Field: errdefs.Field(err)}
	if werr := f.writeJSON(frameError, we); werr != nil {
		return werr
	}
	return f.flush()
}

// remoteError is an error reported by the agent, carrying the errdefs kind it was classified as.
type remoteError struct {
	msg  string
	kind error // nil for "internal"
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.kind }

var errKinds = map[string]error{
	"invalid":      errdefs.ErrInvalid,
	"unauthorized": errdefs.ErrUnauthorized,
	"denied":       errdefs.ErrDenied,
	"not_found":    errdefs.ErrNotFound,
	"conflict":     errdefs.ErrConflict,
	"too_large":    errdefs.ErrTooLarge,
	"exhausted":    errdefs.ErrExhausted,
	"unavailable":  errdefs.ErrUnavailable,
}

// decodeError turns an error frame's payload back into an error of the same errdefs kind.
func decodeError(payload []byte) error {
	var we wireError
	if err := json.Unmarshal(payload, &we); err != nil {
		return fmt.Errorf("decode agent error: %v: %w", err, errProtocol)
	}
	if we.Code == "invalid" && we.Field != "" {
		return errdefs.Invalid(we.Field, "%s", strings.TrimPrefix(we.Message, we.Field+": "))
	}
	return &remoteError{msg: we.Message, kind: errKinds[we.Code]}
}

// Output frame payloads.

func putOffset(b *[8]byte, off int64) []byte {
	binary.BigEndian.PutUint64(b[:], uint64(off))
	return b[:]
}

// decodeEvent turns an output frame (stdout, stderr, truncated or exit) into an Event. The
// returned Data is a copy: it does not alias payload.
func decodeEvent(typ byte, payload []byte) (Event, error) {
	if len(payload) < 8 {
		return Event{}, fmt.Errorf("short %q frame: %w", typ, errProtocol)
	}
	off := int64(binary.BigEndian.Uint64(payload))
	if off < 0 {
		return Event{}, fmt.Errorf("negative offset in %q frame: %w", typ, errProtocol)
	}
	rest := payload[8:]
	switch typ {
	case frameStdout, frameStderr:
		ev := Event{Type: EventStdout, Offset: off, Data: append([]byte(nil), rest...)}
		if typ == frameStderr {
			ev.Type = EventStderr
		}
		return ev, nil
	case frameTruncated:
		if len(rest) != 8 {
			return Event{}, fmt.Errorf("bad truncated frame: %w", errProtocol)
		}
		dropped := int64(binary.BigEndian.Uint64(rest))
		if dropped < 0 {
			return Event{}, fmt.Errorf("negative drop count: %w", errProtocol)
		}
		return Event{Type: EventTruncated, Offset: off, Dropped: dropped}, nil
	case frameExit:
		var exit Exit
		if err := json.Unmarshal(rest, &exit); err != nil {
			return Event{}, fmt.Errorf("decode exit: %v: %w", err, errProtocol)
		}
		return Event{Type: EventExit, Offset: off, Exit: &exit}, nil
	}
	return Event{}, fmt.Errorf("unexpected frame %q in output stream: %w", typ, errProtocol)
}

// dataReader reads the bytes of a data stream: data frames up to an end frame (io.EOF) or an
// error frame (the decoded error). Any other frame is a protocol error.
type dataReader struct {
	f    *framer
	rest []byte // unread part of the current frame, aliasing f.buf
	err  error  // sticky
}

func (d *dataReader) Read(p []byte) (int, error) {
	for len(d.rest) == 0 {
		if d.err != nil {
			return 0, d.err
		}
		typ, payload, err := d.f.readFrame()
		switch {
		case err == io.EOF:
			d.err = io.ErrUnexpectedEOF // the peer hung up before the end frame
		case err != nil:
			d.err = err
		case typ == frameData:
			d.rest = payload
		case typ == frameEnd:
			d.err = io.EOF
		case typ == frameError:
			d.err = decodeError(payload)
		default:
			d.err = fmt.Errorf("unexpected frame %q in data stream: %w", typ, errProtocol)
		}
	}
	n := copy(p, d.rest)
	d.rest = d.rest[n:]
	return n, nil
}

// dataWriter writes a data stream as data frames; Close sends the end frame. Nothing is flushed
// until a chunk fills or Close is called.
type dataWriter struct {
	f *framer
}

func (d dataWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := min(len(p), dataChunk)
		if err := d.f.writeFrame(frameData, nil, p[:c]); err != nil {
			return n, err
		}
		n += c
		p = p[c:]
	}
	return n, nil
}

// ReadFrom copies r into data frames without an intermediate bufio copy.
func (d dataWriter) ReadFrom(r io.Reader) (int64, error) {
	buf := make([]byte, dataChunk)
	var total int64
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if werr := d.f.writeFrame(frameData, nil, buf[:n]); werr != nil {
				return total, werr
			}
			total += int64(n)
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

func (d dataWriter) Close() error {
	if err := d.f.writeFrame(frameEnd, nil, nil); err != nil {
		return err
	}
	return d.f.flush()
}
