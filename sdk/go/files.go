package corral

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
)

// ReadFile opens the regular file at path inside the sandbox. The caller reads the content from
// the returned body and must close it.
func (c *Client) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	resp, err := c.send(ctx, request{
		method: http.MethodGet,
		path:   sandboxPath(id, "files"),
		query:  url.Values{"path": {path}},
	})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WriteFileOptions tunes [Client.WriteFile]. The zero value creates or replaces the file with the
// server's default mode, owned by the sandbox's default user, and fails if the parent directory
// is missing.
type WriteFileOptions struct {
	// Mode holds the permission bits (with setuid, setgid, sticky) of a created file; 0 takes the
	// server's default (0644).
	Mode fs.FileMode
	// User owns a created file (name or uid); empty takes the sandbox's default user.
	User string
	// Parents creates missing parent directories.
	Parents bool
	// Append adds to the end of an existing file instead of replacing it.
	Append bool
}

// WriteFile writes everything r yields to the file at path inside the sandbox and returns the
// file's new description. r is read to its end, not closed.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, opts WriteFileOptions) (*FileInfo, error) {
	q := url.Values{"path": {path}}
	if opts.Mode != 0 {
		q.Set("mode", "0"+strconv.FormatUint(uint64(unixMode(opts.Mode)), 8))
	}
	if opts.User != "" {
		q.Set("user", opts.User)
	}
	if opts.Parents {
		q.Set("parents", "true")
	}
	if opts.Append {
		q.Set("append", "true")
	}
	var out FileInfo
	err := c.do(ctx, request{
		method:      http.MethodPut,
		path:        sandboxPath(id, "files"),
		query:       q,
		body:        r,
		contentType: "application/octet-stream",
		// An append that failed on the way may have landed: repeating it could write twice.
		once: opts.Append,
	}, &out)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// Stat describes the file at path inside the sandbox.
func (c *Client) Stat(ctx context.Context, id, path string) (*FileInfo, error) {
	var out FileInfo
	err := c.do(ctx, request{
		method: http.MethodGet,
		path:   sandboxPath(id, "files", "stat"),
		query:  url.Values{"path": {path}},
	}, &out)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// List describes the entries of the directory at path inside the sandbox.
func (c *Client) List(ctx context.Context, id, path string) ([]FileInfo, error) {
	var out struct {
		Files []FileInfo `json:"files"`
	}
	err := c.do(ctx, request{
		method: http.MethodGet,
		path:   sandboxPath(id, "files", "list"),
		query:  url.Values{"path": {path}},
	}, &out)
	if err != nil {
		return nil, err
	}
	return out.Files, nil
}

// Mkdir creates a directory inside the sandbox and returns its description.
func (c *Client) Mkdir(ctx context.Context, id string, req MkdirRequest) (*FileInfo, error) {
	var out FileInfo
	err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "files", "mkdir"), json: req}, &out)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// Remove deletes the file or empty directory at path inside the sandbox; recursive also deletes
// a directory's contents.
func (c *Client) Remove(ctx context.Context, id, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	return c.do(ctx, request{method: http.MethodDelete, path: sandboxPath(id, "files"), query: q}, nil)
}

// Move renames the file or directory source to destination inside the sandbox, as rename(2)
// does: within one filesystem (paths on different mounts are refused: [IsInvalid]), a file or
// empty directory at destination replaced, the parent of destination required to exist
// ([IsNotFound] otherwise). It returns the destination's description.
func (c *Client) Move(ctx context.Context, id, source, destination string) (*FileInfo, error) {
	var out FileInfo
	err := c.do(ctx, request{
		method: http.MethodPost,
		path:   sandboxPath(id, "files", "move"),
		json:   MoveRequest{Source: source, Destination: destination},
	}, &out)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// Watch watches the directory dir inside the sandbox (with recursive, every directory below it
// too, including those made later) and returns once the watch is in place: every change after
// that is reported by [WatchStream.Next]. A sandbox allows a few watches at once ([IsExhausted]
// beyond them, or for a recursive watch of too large a tree). Opening a watch counts as activity
// for the sandbox's idle TTL; keeping it open does not. The caller must Close the stream.
func (c *Client) Watch(ctx context.Context, id, dir string, recursive bool) (*WatchStream, error) {
	q := url.Values{"path": {dir}}
	if recursive {
		q.Set("recursive", "true")
	}
	resp, err := c.send(ctx, request{method: http.MethodGet, path: sandboxPath(id, "files", "watch"), query: q})
	if err != nil {
		return nil, err
	}
	ws := &WatchStream{body: resp.Body, dec: json.NewDecoder(resp.Body), status: resp.StatusCode}
	ev, err := ws.Next()
	if err == nil && ev.Type != WatchStart {
		err = fmt.Errorf("watch stream began with %q, want %q", ev.Type, WatchStart)
	}
	if err != nil {
		ws.Close()
		return nil, err
	}
	return ws, nil
}

// WatchStream is an open watch of a directory tree, read with [WatchStream.Next]. It is not safe
// for concurrent use, except that Close may be called from any goroutine to end a blocked Next.
type WatchStream struct {
	body   io.ReadCloser
	dec    *json.Decoder
	status int
	gone   bool  // the watched directory's own remove or rename was read: the stream ends
	err    error // sticky: once set, Next returns it

	closed    atomic.Bool
	closeOnce sync.Once
}

// watchLine is a line of a watch stream: an event, or an error that ended it.
type watchLine struct {
	WatchEvent
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}

// Next returns the next event. When the watched directory is removed or moved away, its event
// (with an empty Name) is the last one and Next then returns io.EOF. A watch the server ended
// (the sandbox stopped, the tree outgrew the directories one watch covers) returns an
// *[APIError] saying why; after Close, [ErrStreamClosed].
func (w *WatchStream) Next() (WatchEvent, error) {
	if w.err != nil {
		return WatchEvent{}, w.err
	}
	var line watchLine
	if err := w.dec.Decode(&line); err != nil {
		switch {
		case w.closed.Load():
			w.err = ErrStreamClosed
		case errors.Is(err, io.EOF) && w.gone:
			w.err = io.EOF
		case errors.Is(err, io.EOF):
			w.err = fmt.Errorf("watch stream ended before its directory went away: %w", io.ErrUnexpectedEOF)
		default:
			w.err = fmt.Errorf("read watch stream: %w", err)
		}
		return WatchEvent{}, w.err
	}
	if line.Type == EventError {
		w.err = &APIError{Status: w.status, Code: line.Code, Message: line.Message}
		return WatchEvent{}, w.err
	}
	if line.Name == "" && (line.Type == WatchRemove || line.Type == WatchRename) {
		w.gone = true
	}
	return line.WatchEvent, nil
}

// Close ends the watch. It is safe to call more than once and from another goroutine.
func (w *WatchStream) Close() error {
	w.closeOnce.Do(func() {
		w.closed.Store(true)
		w.body.Close()
	})
	return nil
}

// TarOut returns a tar stream of the tree at path inside the sandbox. The caller must close it.
func (c *Client) TarOut(ctx context.Context, id, path string) (io.ReadCloser, error) {
	resp, err := c.send(ctx, request{
		method: http.MethodGet,
		path:   sandboxPath(id, "files", "tar"),
		query:  url.Values{"path": {path}},
	})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// TarIn extracts the tar stream r into the directory dir inside the sandbox. r is read to its
// end, not closed.
func (c *Client) TarIn(ctx context.Context, id, dir string, r io.Reader) error {
	return c.do(ctx, request{
		method:      http.MethodPut,
		path:        sandboxPath(id, "files", "tar"),
		query:       url.Values{"path": {dir}},
		body:        r,
		contentType: "application/x-tar",
	}, nil)
}

// unixMode converts the permission and special bits of m to their Unix octal form.
func unixMode(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}
