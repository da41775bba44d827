//go:build linux

package blobstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Permissions of what the directory backend creates. The root is private to the host's root
// user; below it, files and directories are readable by every corral process sharing the mount.
const (
	rootPerm = 0o700
	dirPerm  = 0o755
	filePerm = 0o644
)

// staleTemp is how old a file in .tmp must be before Open deletes it as a crashed Put's leftover.
// A live Put writes to its file far more often; one whose reader stalls for longer than this may
// lose its file and then fails at the rename.
const staleTemp = time.Hour

// copyBuf is the size of the buffer Put copies through.
const copyBuf = 1 << 20

// dirStore is the directory backend. It holds no open descriptors between calls, so it needs no
// Close and survives the root being remounted.
type dirStore struct {
	root string // absolute, cleaned
}

// openDir creates the root (0700) and its .tmp directory if missing and deletes temp files
// older than staleTemp.
func openDir(ctx context.Context, root string) (*dirStore, error) {
	s := &dirStore{root: root}
	if err := os.MkdirAll(root, rootPerm); err != nil {
		return nil, fmt.Errorf("open %s: %w", s, classify(err))
	}
	rootFD, err := s.openRoot()
	if err != nil {
		return nil, err
	}
	defer unix.Close(rootFD)
	err = unix.Mkdirat(rootFD, tmpDir, dirPerm)
	created := err == nil
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("open %s: create %s: %w", s, tmpDir, classify(err))
	}
	tmpFD, err := openBeneath(rootFD, tmpDir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: open %s: %w", s, tmpDir, s.pathErr(tmpDir, err))
	}
	tmp := os.NewFile(uintptr(tmpFD), path.Join(root, tmpDir))
	defer tmp.Close()
	if created {
		// As for every directory the store creates, undo the umask (see mkdirAll).
		if err := tmp.Chmod(dirPerm); err != nil {
			return nil, fmt.Errorf("open %s: %w", s, err)
		}
	}
	names, err := tmp.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("open %s: read %s: %w", s, tmpDir, err)
	}
	cutoff := time.Now().Add(-staleTemp)
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("open %s: %w", s, err)
		}
		var st unix.Stat_t
		if unix.Fstatat(tmpFD, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT == unix.S_IFDIR {
			continue
		}
		if time.Unix(st.Mtim.Unix()).Before(cutoff) {
			// Another process may delete it at the same moment; ENOENT is as good as success.
			if err := unix.Unlinkat(tmpFD, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
				return nil, fmt.Errorf("open %s: remove stale %s/%s: %w", s, tmpDir, name, err)
			}
		}
	}
	return s, nil
}

// String returns "dir:" and the root.
func (s *dirStore) String() string { return "dir:" + s.root }

// openRoot opens the root directory. The root path itself may be a symlink (an administrator's
// choice); nothing below it may.
func (s *dirStore) openRoot() (int, error) {
	fd, err := unix.Open(s.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open store root %s: %w", s.root, classify(err))
	}
	return fd, nil
}

// openBeneath opens name relative to dirFD without following any symlink and without leaving
// dirFD's tree.
func openBeneath(dirFD int, name string, flags uint64, mode uint64) (int, error) {
	how := &unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC | unix.O_NOCTTY,
		Mode:    mode,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	for try := 0; ; try++ {
		fd, err := unix.Openat2(dirFD, name, how)
		// EAGAIN: a concurrent rename made the kernel unsure the lookup stayed beneath; retry.
		if (errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR)) && try < 100 {
			continue
		}
		return fd, err
	}
}

// pathErr turns an error from a lookup of rel under the root into one for the caller: symlinks
// are refused with errdefs.ErrDenied, everything else keeps its errno.
func (s *dirStore) pathErr(rel string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%s/%s: the path contains a symlink, which the blob store refuses to follow: %w", s.root, rel, errdefs.ErrDenied)
	case errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("openat2 is not available (the directory backend needs Linux 5.6 or later, and a seccomp profile that allows it): %w", err)
	}
	return classify(err)
}

// classify adds an error kind to the errnos a caller can act on.
func classify(err error) error {
	switch {
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return fmt.Errorf("%w: %w", errdefs.ErrExhausted, err)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM), errors.Is(err, unix.EROFS):
		return fmt.Errorf("%w: %w", errdefs.ErrDenied, err)
	}
	return err
}

// missing reports whether err from a lookup means that nothing is stored there: the name does not
// exist, or one of its parents is an object rather than a directory.
func missing(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR)
}

// Put implements Store.Put: a temp file in .tmp, fsync, rename into place, fsync the parent.
func (s *dirStore) Put(ctx context.Context, key string, r io.Reader, size int64) (err error) {
	if err := CheckKey(key); err != nil {
		return err
	}
	rootFD, err := s.openRoot()
	if err != nil {
		return err
	}
	defer unix.Close(rootFD)
	tmpFD, err := openBeneath(rootFD, tmpDir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("put %s: open %s: %w", key, tmpDir, s.pathErr(tmpDir, err))
	}
	defer unix.Close(tmpFD)

	tmpName, f, err := createTemp(tmpFD, path.Join(s.root, tmpDir))
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	committed := false
	defer func() {
		f.Close()
		if !committed {
			unix.Unlinkat(tmpFD, tmpName, 0)
		}
	}()

	src := newPutReader(ctx, r, size)
	// The plain Writer hides os.File's ReadFrom, which would copy through a 32 KiB buffer.
	if _, err := io.CopyBuffer(struct{ io.Writer }{f}, src, make([]byte, copyBuf)); err != nil {
		if src.err != nil {
			return fmt.Errorf("put %s: %w", key, src.err)
		}
		return fmt.Errorf("put %s: write: %w", key, classify(err))
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("put %s: sync: %w", key, classify(err))
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}

	dir, base := path.Split(key)
	parentFD, err := s.mkdirAll(rootFD, strings.TrimSuffix(dir, "/"))
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	defer unix.Close(parentFD)
	if err := unix.Renameat(tmpFD, tmpName, parentFD, base); err != nil {
		if errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("put %s: other keys start with %s/, and this backend cannot store an object there: %w", key, key, errdefs.ErrConflict)
		}
		return fmt.Errorf("put %s: rename into place: %w", key, classify(err))
	}
	committed = true
	// The rename is durable once the parent directory is.
	if err := unix.Fsync(parentFD); err != nil {
		return fmt.Errorf("put %s: sync directory: %w", key, classify(err))
	}
	return nil
}

// createTemp creates a new file for writing in the directory dirFD (named dirPath in errors).
func createTemp(dirFD int, dirPath string) (string, *os.File, error) {
	var b [12]byte
	rand.Read(b[:])
	name := "put-" + hex.EncodeToString(b[:])
	fd, err := openBeneath(dirFD, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, filePerm)
	if err != nil {
		return "", nil, fmt.Errorf("create temp file in %s: %w", dirPath, classify(err))
	}
	f := os.NewFile(uintptr(fd), path.Join(dirPath, name))
	// The umask may have taken bits that other corral processes on a shared mount need.
	if err := f.Chmod(filePerm); err != nil {
		f.Close()
		unix.Unlinkat(dirFD, name, 0)
		return "", nil, fmt.Errorf("chmod temp file %s: %w", f.Name(), err)
	}
	return name, f, nil
}

// mkdirAll creates the directory rel (empty for the root) and its parents beneath rootFD, one
// segment at a time so that no symlink is ever followed, and returns it opened.
func (s *dirStore) mkdirAll(rootFD int, rel string) (int, error) {
	fd, err := unix.Dup(rootFD)
	if err != nil {
		return -1, err
	}
	if rel == "" {
		return fd, nil
	}
	done := ""
	for seg := range strings.SplitSeq(rel, "/") {
		done = path.Join(done, seg)
		created := false
		if err := unix.Mkdirat(fd, seg, dirPerm); err == nil {
			created = true
		} else if !errors.Is(err, unix.EEXIST) {
			unix.Close(fd)
			return -1, fmt.Errorf("create directory %s: %w", done, s.pathErr(done, err))
		}
		next, err := openBeneath(fd, seg, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err == nil && created {
			// As in createTemp, undo the umask; and make the new entry durable with its parent.
			err = errors.Join(unix.Fchmod(next, dirPerm), unix.Fsync(fd))
		}
		unix.Close(fd)
		if err != nil {
			if next >= 0 {
				unix.Close(next)
			}
			if errors.Is(err, unix.ENOTDIR) {
				return -1, fmt.Errorf("%s is an object, so no key can continue below it: %w", done, errdefs.ErrConflict)
			}
			return -1, fmt.Errorf("open directory %s: %w", done, s.pathErr(done, err))
		}
		fd = next
	}
	return fd, nil
}

// openObject opens key for reading. It refuses anything but a regular file; a directory (a prefix
// of other keys) is reported as missing.
func (s *dirStore) openObject(op, key string) (*os.File, unix.Stat_t, error) {
	var st unix.Stat_t
	if err := CheckKey(key); err != nil {
		return nil, st, err
	}
	rootFD, err := s.openRoot()
	if err != nil {
		return nil, st, err
	}
	defer unix.Close(rootFD)
	// O_NONBLOCK so that a FIFO someone put in the tree cannot hang the open.
	fd, err := openBeneath(rootFD, key, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		if missing(err) {
			return nil, st, errdefs.NotFound("%s %s in %s", op, key, s)
		}
		return nil, st, fmt.Errorf("%s %s: %w", op, key, s.pathErr(key, err))
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, st, fmt.Errorf("%s %s: %w", op, key, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		unix.Close(fd)
		return nil, st, errdefs.NotFound("%s %s in %s", op, key, s)
	default:
		unix.Close(fd)
		return nil, st, fmt.Errorf("%s %s: %s/%s is not a regular file: %w", op, key, s.root, key, errdefs.ErrInvalid)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, st, fmt.Errorf("%s %s: %w", op, key, err)
	}
	return os.NewFile(uintptr(fd), path.Join(s.root, key)), st, nil
}

// Get implements Store.Get. The file stays readable after a replacing Put or a Delete.
func (s *dirStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	f, _, err := s.openObject("get", key)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// GetRange implements Store.GetRange over an open file.
func (s *dirStore) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	if err := checkRange(off, length); err != nil {
		return nil, err
	}
	f, _, err := s.openObject("get", key)
	if err != nil {
		return nil, err
	}
	return &sectionFile{SectionReader: io.NewSectionReader(f, off, length), f: f}, nil
}

// sectionFile reads a range of an open file and closes the file.
type sectionFile struct {
	*io.SectionReader
	f *os.File
}

// Close closes the file.
func (r *sectionFile) Close() error { return r.f.Close() }

// Stat implements Store.Stat from the file's size and modification time.
func (s *dirStore) Stat(ctx context.Context, key string) (Info, error) {
	f, st, err := s.openObject("stat", key)
	if err != nil {
		return Info{}, err
	}
	f.Close()
	return Info{Key: key, Size: st.Size, ModTime: time.Unix(st.Mtim.Unix())}, nil
}

// Delete implements Store.Delete by unlinking the file.
func (s *dirStore) Delete(ctx context.Context, key string) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	rootFD, err := s.openRoot()
	if err != nil {
		return err
	}
	defer unix.Close(rootFD)
	dir, base := path.Split(key)
	parentFD := rootFD
	if dir != "" {
		dir = strings.TrimSuffix(dir, "/")
		parentFD, err = openBeneath(rootFD, dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if missing(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("delete %s: %w", key, s.pathErr(dir, err))
		}
		defer unix.Close(parentFD)
	}
	// Empty parent directories stay: removing them would race with a Put creating a file there.
	err = unix.Unlinkat(parentFD, base, 0)
	if err == nil || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EISDIR) {
		// EISDIR: the key is only a prefix of other keys; there is no object to delete.
		return nil
	}
	return fmt.Errorf("delete %s: %w", key, classify(err))
}

// List implements Store.List, walking only the directory the prefix names.
func (s *dirStore) List(ctx context.Context, prefix string) ([]Info, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	rootFD, err := s.openRoot()
	if err != nil {
		return nil, err
	}
	defer unix.Close(rootFD)
	// Only the directory the prefix names is walked, not the whole tree.
	dir, first := splitPrefix(prefix)
	fd := rootFD
	if dir != "" {
		fd, err = openBeneath(rootFD, dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if missing(err) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", prefix, s.pathErr(dir, err))
		}
	} else if fd, err = unix.Dup(rootFD); err != nil {
		return nil, fmt.Errorf("list %s: %w", prefix, err)
	}
	var out []Info
	if err := s.walk(ctx, fd, dir, first, &out); err != nil {
		return nil, fmt.Errorf("list %q: %w", prefix, err)
	}
	slices.SortFunc(out, func(a, b Info) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// walk appends to out the regular files under the directory fd (the key prefix rel), whose
// names there start with first. It closes fd. Symlinks, special files and names that are not key
// segments are skipped: no key can reach them. Entries removed during the walk are skipped too.
func (s *dirStore) walk(ctx context.Context, fd int, rel, first string, out *[]Info) error {
	if err := ctx.Err(); err != nil {
		unix.Close(fd)
		return err
	}
	d := os.NewFile(uintptr(fd), path.Join(s.root, rel))
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("read %s: %w", d.Name(), err)
	}
	for _, name := range names {
		if !strings.HasPrefix(name, first) || checkSegment(name, name) != nil || rel == "" && name == tmpDir {
			continue
		}
		key := path.Join(rel, name)
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return fmt.Errorf("stat %s/%s: %w", s.root, key, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			*out = append(*out, Info{Key: key, Size: st.Size, ModTime: time.Unix(st.Mtim.Unix())})
		case unix.S_IFDIR:
			sub, err := openBeneath(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			if missing(err) {
				continue
			}
			if err != nil {
				return fmt.Errorf("open %s/%s: %w", s.root, key, s.pathErr(key, err))
			}
			if err := s.walk(ctx, sub, key, "", out); err != nil {
				return err
			}
		}
	}
	return nil
}

// LocalPath returns the file that holds key, for callers that open or mount objects where they
// lie (the layer store mounts EROFS images in place). It fails like Get when key is missing or is
// not a regular file reached without symlinks. A later Put of key replaces the file by rename, so
// whoever opened the old one keeps reading it.
func (s *dirStore) LocalPath(key string) (string, error) {
	f, _, err := s.openObject("locate", key)
	if err != nil {
		return "", err
	}
	f.Close()
	return path.Join(s.root, key), nil
}

// PutFile stores the finished file at p under key: moved into place when p is on the store's
// filesystem (no copy), copied through Put otherwise. On success p is gone or, when copied,
// left to the caller.
func (s *dirStore) PutFile(ctx context.Context, key, p string) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("put %s: %s is not a regular file: %w", key, p, errdefs.ErrInvalid)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("put %s: sync %s: %w", key, p, classify(err))
	}
	rootFD, err := s.openRoot()
	if err != nil {
		return err
	}
	defer unix.Close(rootFD)
	dir, base := path.Split(key)
	parentFD, err := s.mkdirAll(rootFD, strings.TrimSuffix(dir, "/"))
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	defer unix.Close(parentFD)
	if err := f.Chmod(filePerm); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	err = unix.Renameat(unix.AT_FDCWD, p, parentFD, base)
	if errors.Is(err, unix.EXDEV) {
		return s.Put(ctx, key, f, fi.Size())
	}
	if err != nil {
		if errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("put %s: other keys start with %s/, and this backend cannot store an object there: %w", key, key, errdefs.ErrConflict)
		}
		return fmt.Errorf("put %s: move %s into place: %w", key, p, classify(err))
	}
	if err := unix.Fsync(parentFD); err != nil {
		return fmt.Errorf("put %s: sync directory: %w", key, classify(err))
	}
	return nil
}
