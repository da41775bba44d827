package corral

import (
	"context"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
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
