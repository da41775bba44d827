// Package runcd is the wire between Corral's runc runtime and corral-runcd, a long-lived
// process that starts runc containers with runc's own libcontainer, at the version of the runc
// binary Corral runs for everything else. A create through it skips what `runc run --detach`
// pays per container before runc's init even starts: a Go binary's exec and runtime start, its
// command line and config parsing (about 15 ms of 43 on the development VM). The container it
// starts is runc's in every respect: the same state directory and state.json, so `runc exec`,
// `kill`, `pause`, `delete` of the runc binary work on it as on one `runc run` made.
//
// One request per connection on a SOCK_SEQPACKET socket: the client sends a Request as JSON
// with its files (the container's stdout and stderr first, then the extra files it gets as fd
// 3 onwards) in one message, and reads one Reply.
package runcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Request asks for a container to be created and started, as `runc --root Root run --detach
// --bundle Bundle ID` with the stdio and --preserve-fds of the message's files.
type Request struct {
	Root   string `json:"root"`
	ID     string `json:"id"`
	Bundle string `json:"bundle"`
	// Extra is how many files after the stdio one the container gets, as fds 3 onwards.
	Extra int `json:"extra"`
}

// Reply is the outcome: the container's init pid, or why there is none (the container was
// destroyed again).
type Reply struct {
	Pid   int    `json:"pid,omitempty"`
	Error string `json:"error,omitempty"`
}

// ErrUnreachable is a Run whose request never reached corral-runcd (nothing listens on the
// socket): nothing was started, and the request may be made again.
var ErrUnreachable = errors.New("corral-runcd unreachable")

// replyWait bounds the wait for a reply.
const replyWait = 2 * time.Minute

// maxMessage bounds a request or reply; both are a few hundred bytes.
const maxMessage = 16 << 10

// maxFiles bounds the files of one request.
const maxFiles = 16

// Run asks the corral-runcd listening on sock to create and start a container, and returns its
// init's pid. stdio is the container's stdout and stderr (its stdin is /dev/null). ctx bounds
// the connection; once the request is sent, Run waits for its outcome and then returns ctx's
// error if it ended meanwhile (the container may then exist: destroy it as after any error).
func Run(ctx context.Context, sock string, req Request, stdio *os.File, extra []*os.File) (int, error) {
	req.Extra = len(extra)
	if 1+len(extra) > maxFiles {
		return 0, fmt.Errorf("runcd: %d files, at most %d", 1+len(extra), maxFiles)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unixpacket", sock)
	if err != nil {
		if errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ENOENT) {
			return 0, fmt.Errorf("%w: %v", ErrUnreachable, err)
		}
		return 0, fmt.Errorf("runcd: %w", err)
	}
	conn := c.(*net.UnixConn)
	defer conn.Close()
	// Once sent, the request is waited for even when ctx ends: a create abandoned half-way
	// would be finished by corral-runcd after the caller cleaned up, and run on unrecorded.
	// Its outcome comes within replyWait (libcontainer bounds its own steps by a minute).
	conn.SetDeadline(time.Now().Add(replyWait))
	b, err := json.Marshal(req)
	if err != nil {
		return 0, err
	}
	fds := []int{int(stdio.Fd())}
	for _, f := range extra {
		fds = append(fds, int(f.Fd()))
	}
	if _, _, err := conn.WriteMsgUnix(b, unix.UnixRights(fds...), nil); err != nil {
		return 0, fmt.Errorf("runcd: send request: %w", err)
	}
	buf := make([]byte, maxMessage)
	n, err := conn.Read(buf)
	if err != nil {
		return 0, fmt.Errorf("runcd: read reply: %w", err)
	}
	var rep Reply
	if err := json.Unmarshal(buf[:n], &rep); err != nil {
		return 0, fmt.Errorf("runcd: reply: %w", err)
	}
	if rep.Error != "" {
		return 0, errors.New(rep.Error)
	}
	if rep.Pid <= 0 {
		return 0, fmt.Errorf("runcd: reply without a pid")
	}
	if err := ctx.Err(); err != nil {
		// Made, but the caller has gone: it is the caller's to destroy, as after any failure.
		return 0, err
	}
	return rep.Pid, nil
}

// ReadRequest reads a connection's request and its files: stdio first, then the extras.
func ReadRequest(conn *net.UnixConn) (Request, *os.File, []*os.File, error) {
	buf, oob := make([]byte, maxMessage), make([]byte, unix.CmsgSpace(maxFiles*4))
	n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return Request{}, nil, nil, err
	}
	var files []*os.File
	cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err == nil {
		for _, m := range cmsgs {
			fds, perr := unix.ParseUnixRights(&m)
			if perr != nil {
				err = perr
				continue
			}
			for _, fd := range fds {
				files = append(files, os.NewFile(uintptr(fd), fmt.Sprintf("runcd-fd-%d", len(files))))
			}
		}
	}
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	if err != nil {
		closeAll()
		return Request{}, nil, nil, fmt.Errorf("request's files: %w", err)
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		closeAll()
		return Request{}, nil, nil, errors.New("request truncated")
	}
	var req Request
	if err := json.Unmarshal(buf[:n], &req); err != nil {
		closeAll()
		return Request{}, nil, nil, fmt.Errorf("request: %w", err)
	}
	if req.Extra < 0 || len(files) != 1+req.Extra {
		closeAll()
		return Request{}, nil, nil, fmt.Errorf("request names %d extra files and carries %d files", req.Extra, len(files))
	}
	return req, files[0], files[1:], nil
}

// WriteReply answers a request.
func WriteReply(conn *net.UnixConn, rep Reply) error {
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	_, err = conn.Write(b)
	return err
}
