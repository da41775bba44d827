package agentrpc

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// tarOut streams a tar archive of p: a reply with p's FileInfo, then the archive as data frames.
// Entry names are relative to p (a file is archived under its base name). Symbolic links are
// stored as links; devices, FIFOs and sockets are skipped; like tar --one-file-system, the walk
// does not descend into other filesystems (so archiving / never reads /proc or /sys), and an
// archive rooted on procfs or sysfs is refused: reading some of their files harms the host.
func (s *Server) tarOut(c *conn, p string) error {
	p, err := cleanPath("path", p)
	if err != nil {
		return err
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(p, &sfs); err == nil && (sfs.Type == unix.PROC_SUPER_MAGIC || sfs.Type == unix.SYSFS_MAGIC) {
		return errdefs.Invalid("path", "refusing to archive %s: it is on procfs or sysfs", p)
	}
	info := fileInfoOf(p, fi)
	if err := c.f.writeJSON(frameReply, reply{File: &info}); err != nil {
		return err
	}
	dw := dataWriter{c.f}
	bw := bufio.NewWriterSize(dw, dataChunk)
	tw := tar.NewWriter(bw)
	if !fi.IsDir() {
		err = addTarEntry(tw, p, fi.Name(), fi)
	} else {
		rootDev := devOf(fi)
		err = filepath.WalkDir(p, func(fp string, d fs.DirEntry, werr error) error {
			if werr != nil {
				return werr
			}
			if fp == p {
				return nil
			}
			fi, err := d.Info()
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed during the walk
			}
			if err != nil {
				return err
			}
			rel := filepath.ToSlash(fp[len(p):])
			rel = strings.TrimPrefix(rel, "/")
			if err := addTarEntry(tw, fp, rel, fi); err != nil {
				return err
			}
			if fi.IsDir() && devOf(fi) != rootDev {
				return fs.SkipDir // a mount point: keep the directory, not its contents
			}
			return nil
		})
	}
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		return fmt.Errorf("archive %s: %w", p, err)
	}
	return dw.Close()
}

func devOf(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Dev
	}
	return 0
}

// addTarEntry writes the entry for the file fp (described by fi) under name. Headers are built
// here rather than by tar.FileInfoHeader, which would look up user names (os/user) for nothing.
func addTarEntry(tw *tar.Writer, fp, name string, fi fs.FileInfo) error {
	h := &tar.Header{Name: name, Mode: int64(unixPerm(fi.Mode())), ModTime: fi.ModTime().Truncate(time.Second)}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		h.Uid, h.Gid = int(st.Uid), int(st.Gid)
	}
	switch m := fi.Mode(); {
	case m.IsRegular():
		h.Typeflag, h.Size = tar.TypeReg, fi.Size()
	case m.IsDir():
		h.Typeflag, h.Name = tar.TypeDir, name+"/"
	case m&fs.ModeSymlink != 0:
		target, err := os.Readlink(fp)
		if err != nil {
			return nil // removed during the walk
		}
		h.Typeflag, h.Linkname = tar.TypeSymlink, target
	default:
		return nil // devices, FIFOs and sockets are not archived
	}
	if h.Typeflag != tar.TypeReg {
		return tw.WriteHeader(h)
	}
	// O_NOFOLLOW: the file may have been replaced by a link since it was listed.
	f, err := os.OpenFile(fp, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ELOOP) {
			return nil
		}
		return err
	}
	defer f.Close()
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	n, err := io.Copy(tw, io.LimitReader(f, h.Size))
	if err != nil {
		return err
	}
	if n < h.Size { // the file shrank while being read: pad, the header is already out
		_, err = io.CopyN(tw, zeroReader{}, h.Size-n)
	}
	return err
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// tarIn extracts the client's tar stream into dir. Every entry is created relative to a
// descriptor of dir, its parent directory opened with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS (or,
// where openat2 is missing, one O_NOFOLLOW component at a time), so nothing is written outside dir
// or through a symbolic link, even one the archive itself created. Rejected outright: absolute
// names, names with "..", device nodes, and archives beyond the TarInLimit bytes or TarInEntries
// entries. Ownership in the headers is ignored (everything belongs to opts.User, default root)
// and setuid/setgid bits are cleared. Extraction is not atomic: entries before a rejected one stay.
func (s *Server) tarIn(c *conn, dir string, opts WriteOptions) error {
	dir, err := cleanPath("path", dir)
	if err != nil {
		return err
	}
	own, err := s.owner(opts.User)
	if err != nil {
		return err
	}
	if opts.Parents {
		if err := mkdirAll(dir, 0o755, own); err != nil {
			return err
		}
	}
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return errdefs.NotFound("extract into %s: no such directory", dir)
		}
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	x := &extractor{root: root, dir: dir, own: own, limit: s.cfg.TarInLimit, maxEntries: s.cfg.TarInEntries, cached: -1}
	defer x.close()
	data := &dataReader{f: c.f}
	tr := tar.NewReader(data)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			if data.err != nil && data.err != io.EOF {
				return data.err // the stream failed, not the archive
			}
			return errdefs.Invalid("archive", "read tar: %v", err)
		}
		if err := x.entry(h, tr); err != nil {
			return err
		}
	}
	// The archive's end-of-archive blocks may be followed by record padding.
	if _, err := io.Copy(io.Discard, data); err != nil {
		return err
	}
	return c.reply(reply{})
}

// extractor writes tar entries beneath root.
type extractor struct {
	root       int // descriptor of dir
	dir        string
	own        *owner
	limit      int64
	maxEntries int
	written    int64
	entries    int
	// The parent directory of the last entry, kept open: archives list a directory's files together.
	cachedRel string
	cached    int
}

func (x *extractor) close() {
	if x.cached >= 0 {
		unix.Close(x.cached)
	}
	unix.Close(x.root)
}

// entryName checks an archive name and returns it relative to the target directory, without a
// trailing slash; "" means the target directory itself.
func entryName(name string) (string, error) {
	switch {
	case strings.IndexByte(name, 0) >= 0:
		return "", errdefs.Invalid("archive", "tar entry %q: NUL in name: rejected", name)
	case strings.HasPrefix(name, "/"):
		return "", errdefs.Invalid("archive", "tar entry %q: absolute path: rejected", name)
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", errdefs.Invalid("archive", "tar entry %q: path with \"..\" escapes the target directory: rejected", name)
		}
	}
	clean := path.Clean(name)
	if clean == "." {
		return "", nil
	}
	return clean, nil
}

func (x *extractor) entry(h *tar.Header, r io.Reader) error {
	x.entries++
	if x.entries > x.maxEntries {
		return fmt.Errorf("extract into %s: archive has more than %d entries: %w", x.dir, x.maxEntries, errdefs.ErrTooLarge)
	}
	name, err := entryName(h.Name)
	if err != nil {
		return err
	}
	perm := uint32(h.Mode) & 0o1777 // no setuid/setgid from an archive
	switch h.Typeflag {
	case tar.TypeChar, tar.TypeBlock:
		return errdefs.Invalid("archive", "tar entry %q: device node: rejected", h.Name)
	case tar.TypeXGlobalHeader:
		return nil
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink, tar.TypeFifo:
	default:
		return errdefs.Invalid("archive", "tar entry %q: unsupported type %q: rejected", h.Name, h.Typeflag)
	}
	if name == "" {
		if h.Typeflag == tar.TypeDir {
			return nil // the target directory itself: left as it is
		}
		return errdefs.Invalid("archive", "tar entry %q: a non-directory cannot replace the target directory", h.Name)
	}
	parentRel, base := path.Split(name)
	parent, err := x.openDir(h.Name, strings.TrimSuffix(parentRel, "/"))
	if err != nil {
		return err
	}
	fail := func(op string, err error) error {
		if err == nil {
			return nil
		}
		return fmt.Errorf("extract tar entry %q: %s: %w", h.Name, op, classify(err))
	}
	switch h.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(parent, base, 0o700); err != nil {
			if err != unix.EEXIST {
				return fail("mkdir", err)
			}
			var st unix.Stat_t
			if err := unix.Fstatat(parent, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return fail("stat", err)
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return errdefs.Conflict("tar entry %q: exists and is not a directory", h.Name)
			}
		}
		fd, err := x.openBeneath(h.Name, name)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return fail("set owner and mode", x.setMeta(fd, perm))

	case tar.TypeReg:
		if h.Size < 0 || h.Size > x.limit-x.written {
			return fmt.Errorf("extract into %s: archive content exceeds the limit of %d bytes at entry %q: %w", x.dir, x.limit, h.Name, errdefs.ErrTooLarge)
		}
		x.written += h.Size
		fd, err := x.replace(parent, base, func() (int, error) {
			return unix.Openat(parent, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		})
		if err != nil {
			return fail("create", err)
		}
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		if _, err := io.CopyN(f, r, h.Size); err != nil {
			if errors.Is(err, io.EOF) {
				return errdefs.Invalid("archive", "tar entry %q: truncated", h.Name)
			}
			return fail("write", err)
		}
		if err := x.setMeta(fd, perm); err != nil {
			return fail("set owner and mode", err)
		}
		ts := []unix.Timespec{unix.NsecToTimespec(h.ModTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
		unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH)
		return fail("close", f.Close())

	case tar.TypeSymlink:
		if h.Linkname == "" || strings.IndexByte(h.Linkname, 0) >= 0 {
			return errdefs.Invalid("archive", "tar entry %q: bad link target", h.Name)
		}
		// The link may point anywhere: nothing is ever written through it (see openBeneath).
		if _, err := x.replace(parent, base, func() (int, error) {
			return -1, unix.Symlinkat(h.Linkname, parent, base)
		}); err != nil {
			return fail("symlink", err)
		}
		if x.own != nil {
			if err := unix.Fchownat(parent, base, x.own.uid, x.own.gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return fail("chown", err)
			}
		}
		return nil

	case tar.TypeLink:
		target, err := entryName(h.Linkname)
		if err != nil || target == "" {
			return errdefs.Invalid("archive", "tar entry %q: hard link target %q escapes the target directory: rejected", h.Name, h.Linkname)
		}
		tparentRel, tbase := path.Split(target)
		tparent, err := x.openBeneath(h.Name, strings.TrimSuffix(tparentRel, "/"))
		if err != nil {
			return err
		}
		defer unix.Close(tparent)
		if _, err := x.replace(parent, base, func() (int, error) {
			return -1, unix.Linkat(tparent, tbase, parent, base, 0)
		}); err != nil {
			return fail("link", err)
		}
		return nil

	case tar.TypeFifo:
		// The mode is subject to the agent's umask: a FIFO cannot be chmod-ed through a descriptor,
		// and chmod by name could be raced into following a link.
		if _, err := x.replace(parent, base, func() (int, error) {
			return -1, unix.Mkfifoat(parent, base, perm&0o777)
		}); err != nil {
			return fail("mkfifo", err)
		}
		if x.own == nil {
			return nil
		}
		fd, err := x.openBeneath(h.Name, name, unix.O_PATH)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return fail("chown", unix.Fchownat(fd, "", x.own.uid, x.own.gid, unix.AT_EMPTY_PATH))
	}
	return nil
}

// replace runs create; when base already exists and is not a directory it is removed (like tar
// does, so an existing symbolic link is replaced rather than followed) and create runs again.
func (x *extractor) replace(parent int, base string, create func() (int, error)) (int, error) {
	fd, err := create()
	if err != unix.EEXIST {
		return fd, err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(parent, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return -1, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return -1, errdefs.Conflict("a directory is in the way")
	}
	if err := unix.Unlinkat(parent, base, 0); err != nil {
		return -1, err
	}
	return create()
}

// setMeta sets owner and mode of the open file fd (chown first: it clears setuid/setgid).
func (x *extractor) setMeta(fd int, perm uint32) error {
	if x.own != nil {
		if err := unix.Fchown(fd, x.own.uid, x.own.gid); err != nil {
			return err
		}
	}
	return unix.Fchmod(fd, perm)
}

// openDir returns a descriptor of the directory rel beneath root (root itself for ""), creating
// missing directories. The descriptor is cached and owned by x: the caller must not close it.
func (x *extractor) openDir(entry, rel string) (int, error) {
	if rel == "" {
		return x.root, nil
	}
	if x.cached >= 0 && x.cachedRel == rel {
		return x.cached, nil
	}
	fd, err := x.openBeneath(entry, rel)
	if errors.Is(err, errdefs.ErrNotFound) {
		fd, err = x.walk(entry, rel, true)
	}
	if err != nil {
		return -1, err
	}
	if x.cached >= 0 {
		unix.Close(x.cached)
	}
	x.cached, x.cachedRel = fd, rel
	return fd, nil
}

// openat2Missing is set when the kernel lacks openat2 (before 5.6); the component walk is used.
var openat2Missing atomic.Bool

// openBeneath opens rel beneath root without following any symbolic link, as a directory, or
// with the extra flags (O_PATH) as whatever it is. The caller closes the descriptor.
func (x *extractor) openBeneath(entry, rel string, extra ...int) (int, error) {
	flags := unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW
	if len(extra) > 0 {
		flags = extra[0] | unix.O_CLOEXEC | unix.O_NOFOLLOW
	}
	if rel == "" {
		rel = "."
	}
	if !openat2Missing.Load() {
		fd, err := unix.Openat2(x.root, rel, &unix.OpenHow{
			Flags:   uint64(flags),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		switch err {
		case nil:
			return fd, nil
		case unix.ENOSYS:
			openat2Missing.Store(true)
		default:
			return -1, x.resolveError(entry, rel, err)
		}
	}
	if len(extra) > 0 {
		dir, base := path.Split(rel)
		parent, err := x.walk(entry, strings.TrimSuffix(dir, "/"), false)
		if err != nil {
			return -1, err
		}
		defer func() {
			if parent != x.root {
				unix.Close(parent)
			}
		}()
		fd, err := unix.Openat(parent, base, flags, 0)
		if err != nil {
			return -1, x.resolveError(entry, rel, err)
		}
		return fd, nil
	}
	return x.walk(entry, rel, false)
}

// walk opens rel beneath root one component at a time with O_NOFOLLOW, creating missing
// directories when create is set. Since entryName rejected ".." and absolute names, no step can
// leave root and none follows a symbolic link. It returns root itself for "".
func (x *extractor) walk(entry, rel string, create bool) (int, error) {
	fd := x.root
	if rel == "" {
		return fd, nil
	}
	for _, comp := range strings.Split(rel, "/") {
		next, err := unix.Openat(fd, comp, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err == unix.ENOENT && create {
			if err = unix.Mkdirat(fd, comp, 0o755); err == nil || err == unix.EEXIST {
				if err == nil && x.own != nil {
					unix.Fchownat(fd, comp, x.own.uid, x.own.gid, unix.AT_SYMLINK_NOFOLLOW)
				}
				next, err = unix.Openat(fd, comp, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
			}
		}
		if err != nil {
			if fd != x.root {
				unix.Close(fd)
			}
			return -1, x.resolveError(entry, rel, err)
		}
		if fd != x.root {
			unix.Close(fd)
		}
		fd = next
	}
	return fd, nil
}

// resolveError explains why rel could not be resolved beneath the target directory, naming the
// component at fault when it is a symbolic link or not a directory.
func (x *extractor) resolveError(entry, rel string, err error) error {
	switch err {
	case unix.ELOOP, unix.ENOTDIR:
		// Find the first component that is not a directory. Each prefix checked before it is a real
		// directory, so this diagnosis follows no link.
		parts := strings.Split(rel, "/")
		for i := range parts {
			prefix := strings.Join(parts[:i+1], "/")
			var st unix.Stat_t
			if unix.Fstatat(x.root, prefix, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
				break
			}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFDIR:
				continue
			case unix.S_IFLNK:
				return errdefs.Invalid("archive", "tar entry %q: path goes through the symbolic link %s: rejected", entry, prefix)
			}
			return errdefs.Invalid("archive", "tar entry %q: %s is not a directory", entry, prefix)
		}
		return errdefs.Invalid("archive", "tar entry %q: path %s goes through a symbolic link or a non-directory: rejected", entry, rel)
	case unix.EXDEV:
		return errdefs.Invalid("archive", "tar entry %q: path %s escapes the target directory: rejected", entry, rel)
	case unix.ENOENT:
		return errdefs.NotFound("tar entry %q: %s does not exist", entry, rel)
	}
	return fmt.Errorf("tar entry %q: open %s: %w", entry, rel, classify(err))
}
