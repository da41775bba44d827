package agentrpc

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// File operations run natively in the agent (as root, never through a sandbox binary) on paths
// as the sandbox sees them.

// cleanPath checks that p is an absolute path and returns it cleaned.
func cleanPath(field, p string) (string, error) {
	switch {
	case p == "":
		return "", errdefs.Invalid(field, "is empty")
	case !filepath.IsAbs(p):
		return "", errdefs.Invalid(field, "%q is not an absolute path", p)
	case strings.IndexByte(p, 0) >= 0:
		return "", errdefs.Invalid(field, "contains a NUL byte")
	}
	return filepath.Clean(p), nil
}

// owner is who owns what an operation creates; nil means root (the agent itself).
type owner struct{ uid, gid int }

func (s *Server) owner(spec string) (*owner, error) {
	if spec == "" {
		return nil, nil
	}
	id, err := s.users.resolve(spec)
	if err != nil {
		return nil, err
	}
	return &owner{uid: int(id.uid), gid: int(id.gid)}, nil
}

// unixPerm converts the permission, setuid, setgid and sticky bits of an fs.FileMode to the
// bits chmod(2) takes.
func unixPerm(m fs.FileMode) uint32 {
	p := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		p |= unix.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		p |= unix.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		p |= unix.S_ISVTX
	}
	return p
}

func fileInfoOf(p string, fi fs.FileInfo) FileInfo {
	out := FileInfo{
		Name: fi.Name(), Path: p, Size: fi.Size(), Mode: fi.Mode(), ModTime: fi.ModTime(),
		IsDir: fi.IsDir(),
	}
	if p == "/" {
		out.Name = "/"
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		out.UID, out.GID = int(st.Uid), int(st.Gid)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		out.Link, _ = os.Readlink(p)
	}
	return out
}

// statPath describes p itself (a symbolic link is not followed).
func statPath(p string) (FileInfo, error) {
	p, err := cleanPath("path", p)
	if err != nil {
		return FileInfo{}, err
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return FileInfo{}, err
	}
	return fileInfoOf(p, fi), nil
}

// readFile streams a regular file: a reply with its FileInfo, data frames, an end frame.
func (s *Server) readFile(c *conn, p string) error {
	p, err := cleanPath("path", p)
	if err != nil {
		return err
	}
	// O_NONBLOCK: opening a FIFO must not hang the request; it is refused below anyway.
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return errdefs.Invalid("path", "%s is not a regular file", p)
	}
	info := fileInfoOf(p, fi)
	if err := c.f.writeJSON(frameReply, reply{File: &info}); err != nil {
		return err
	}
	dw := dataWriter{c.f}
	if _, err := dw.ReadFrom(f); err != nil {
		return fmt.Errorf("read %s: %w", p, err)
	}
	return dw.Close()
}

// writeFile stores the client's data stream at p: in a temporary file in the same directory
// renamed over p when the stream is complete (so readers never see a partial file, and a symbolic
// link at p is replaced, not followed), or appended to p with Append.
func (s *Server) writeFile(c *conn, p string, opts WriteOptions) error {
	p, err := cleanPath("path", p)
	if err != nil {
		return err
	}
	if p == "/" {
		return errdefs.Invalid("path", "/ is a directory")
	}
	own, err := s.owner(opts.User)
	if err != nil {
		return err
	}
	perm := unixPerm(opts.Mode)
	if perm == 0 {
		perm = 0o644
	}
	dir := filepath.Dir(p)
	if opts.Parents {
		if err := mkdirAll(dir, 0o755, own); err != nil {
			return err
		}
	} else if fi, err := os.Stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return errdefs.NotFound("write %s: parent directory %s does not exist (set parents to create it)", p, dir)
		}
		return err
	} else if !fi.IsDir() {
		return errdefs.Invalid("path", "write %s: %s is not a directory", p, dir)
	}
	if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
		return errdefs.Conflict("write %s: is a directory", p)
	}
	data := &dataReader{f: c.f}

	if opts.Append {
		_, statErr := os.Lstat(p)
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NONBLOCK|syscall.O_NOCTTY, fs.FileMode(perm&0o777))
		if err != nil {
			return err
		}
		defer f.Close()
		if fi, err := f.Stat(); err != nil {
			return err
		} else if !fi.Mode().IsRegular() {
			return errdefs.Invalid("path", "append to %s: not a regular file", p)
		}
		if errors.Is(statErr, fs.ErrNotExist) {
			if err := setMeta(f, perm, own); err != nil {
				return err
			}
		}
		if _, err := io.Copy(f, data); err != nil {
			return fmt.Errorf("append to %s: %w", p, err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("append to %s: %w", p, err)
		}
	} else {
		tmp, err := os.CreateTemp(dir, "."+filepath.Base(p)+".corral-*")
		if err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
		committed := false
		defer func() {
			if !committed {
				tmp.Close()
				os.Remove(tmp.Name())
			}
		}()
		if _, err := io.Copy(tmp, data); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
		if err := setMeta(tmp, perm, own); err != nil {
			return err
		}
		if err := tmp.Close(); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
		if err := os.Rename(tmp.Name(), p); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
		committed = true
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	info := fileInfoOf(p, fi)
	return c.reply(reply{File: &info})
}

// setMeta gives a file the agent just created its mode (exactly, whatever the umask) and owner.
func setMeta(f *os.File, perm uint32, own *owner) error {
	if own != nil {
		if err := f.Chown(own.uid, own.gid); err != nil {
			return err
		}
	}
	// After chown, which clears setuid and setgid.
	return f.Chmod(fsMode(perm))
}

// fsMode converts chmod(2) bits to an fs.FileMode.
func fsMode(perm uint32) fs.FileMode {
	m := fs.FileMode(perm & 0o777)
	if perm&unix.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	if perm&unix.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if perm&unix.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// mkdirAll creates dir and its missing parents with perm, owned by own; existing directories are
// left as they are.
func mkdirAll(dir string, perm uint32, own *owner) error {
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return errdefs.Conflict("mkdir %s: exists and is not a directory", dir)
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirAll(parent, perm, own); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) { // created concurrently
			return nil
		}
		return err
	}
	if own != nil {
		if err := os.Lchown(dir, own.uid, own.gid); err != nil {
			return err
		}
	}
	return os.Chmod(dir, fsMode(perm))
}

// mkdir creates one directory, or with Parents, a directory and its missing parents (an existing
// directory is then not an error).
func (s *Server) mkdir(p string, opts WriteOptions) (FileInfo, error) {
	p, err := cleanPath("path", p)
	if err != nil {
		return FileInfo{}, err
	}
	own, err := s.owner(opts.User)
	if err != nil {
		return FileInfo{}, err
	}
	perm := unixPerm(opts.Mode)
	if perm == 0 {
		perm = 0o755
	}
	if opts.Parents {
		if err := mkdirAll(p, perm, own); err != nil {
			return FileInfo{}, err
		}
	} else {
		if err := os.Mkdir(p, 0o700); err != nil {
			switch {
			case errors.Is(err, fs.ErrExist):
				return FileInfo{}, errdefs.Conflict("mkdir %s: already exists", p)
			case errors.Is(err, fs.ErrNotExist):
				return FileInfo{}, errdefs.NotFound("mkdir %s: parent directory does not exist (set parents to create it)", p)
			}
			return FileInfo{}, err
		}
		if own != nil {
			if err := os.Lchown(p, own.uid, own.gid); err != nil {
				return FileInfo{}, err
			}
		}
		if err := os.Chmod(p, fsMode(perm)); err != nil {
			return FileInfo{}, err
		}
	}
	return statPath(p)
}

// remove deletes p (a symbolic link itself, not its target); a non-empty directory needs recursive.
func remove(p string, recursive bool) error {
	p, err := cleanPath("path", p)
	if err != nil {
		return err
	}
	if p == "/" {
		return errdefs.Invalid("path", "refusing to remove /")
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() && recursive {
		return os.RemoveAll(p)
	}
	if err := os.Remove(p); err != nil {
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			return errdefs.Conflict("remove %s: directory not empty (set recursive to remove its contents)", p)
		}
		return err
	}
	return nil
}

// listBatch is how many entries one reply frame of a list carries.
const listBatch = 256

// list streams the entries of a directory (not following symbolic links) in directory order, in
// reply frames of up to listBatch entries, then an end frame.
func (s *Server) list(c *conn, p string) error {
	p, err := cleanPath("path", p)
	if err != nil {
		return err
	}
	d, err := os.Open(p)
	if err != nil {
		return err
	}
	defer d.Close()
	if fi, err := d.Stat(); err != nil {
		return err
	} else if !fi.IsDir() {
		return errdefs.Invalid("path", "%s is not a directory", p)
	}
	for {
		ents, err := d.ReadDir(listBatch)
		batch := make([]FileInfo, 0, len(ents))
		for _, e := range ents {
			fi, ierr := e.Info()
			if ierr != nil {
				continue // removed since it was listed
			}
			batch = append(batch, fileInfoOf(filepath.Join(p, e.Name()), fi))
		}
		if len(batch) > 0 {
			if werr := c.f.writeJSON(frameReply, reply{Files: batch}); werr != nil {
				return werr
			}
		}
		if err == io.EOF || (err == nil && len(ents) == 0) {
			break
		}
		if err != nil {
			return fmt.Errorf("list %s: %w", p, err)
		}
	}
	if err := c.f.writeFrame(frameEnd, nil, nil); err != nil {
		return err
	}
	return c.f.flush()
}
