//go:build linux

package layers

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Kernel limits on names (linux/limits.h).
const (
	pathMax = 4096 // PATH_MAX, including the terminating NUL
	nameMax = 255  // NAME_MAX
	// maxDepth bounds how many directories deep an entry may be. PATH_MAX alone allows 2047, and
	// mkfs.erofs recurses once per level: 2000 levels overflow its 8 MiB stack (a segfault, seen
	// with erofs-utils 1.8.6). Real trees stay far below.
	maxDepth = 512
	maxID    = 1<<32 - 2
	// maxXattrValue is XATTR_SIZE_MAX.
	maxXattrValue = 64 << 10
)

// resolveBeneath makes openat2 refuse to leave the tree or to follow any symlink, so that an
// archive cannot make the extractor write through a symlink it planted (a -> /etc, then a/passwd).
const resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// extractor writes the entries of one archive into a staging tree. It is used by one goroutine.
//
// Every filesystem call is relative to a directory fd that openat2 resolved beneath the root with
// no symlinks, and creates or changes exactly one name in it without following it. The tree is
// private to the import, so the only adversary is the archive itself.
type extractor struct {
	ctx    context.Context
	cfg    Config
	log    *slog.Logger
	rootfd int             // the tree's root, O_RDONLY|O_DIRECTORY
	in     *countingReader // the caller's bytes, for the ratio guard

	// parent caches the O_PATH fd of the last parent directory: archives list siblings together.
	// A directory, once created, is never replaced during an import (a changed type is refused),
	// so a cached fd stays valid.
	parentRel string
	parentFd  int

	hashes   map[fileID][sha256.Size]byte // content hash of each regular file written, by inode
	dirs     map[string]int               // rel -> index in dirMeta
	dirMeta  []dirMeta                    // mode and times of explicit directories, applied by finish
	dropped  map[string]int               // xattrs not kept, by name, for one log line
	entries  int64
	content  int64 // file bytes written
	expanded int64 // content plus 512 per entry, for the ratio guard
	buf      []byte
}

// dirMeta is applied to directories after all entries, so that creating their children does not
// change their mtime and a read-only mode does not stop the extraction.
type dirMeta struct {
	rel          string
	mode         uint32
	atime, mtime time.Time
}

func newExtractor(ctx context.Context, cfg Config, log *slog.Logger, rootfd int, in *countingReader) *extractor {
	return &extractor{
		ctx: ctx, cfg: cfg, log: log, rootfd: rootfd, in: in,
		parentFd: rootfd,
		hashes:   make(map[fileID][sha256.Size]byte),
		dirs:     make(map[string]int),
		dropped:  make(map[string]int),
		buf:      make([]byte, 1<<20),
	}
}

// close releases the cached parent fd; the root fd belongs to the caller.
func (x *extractor) close() {
	x.setParent("", x.rootfd)
}

func (x *extractor) setParent(rel string, fd int) {
	if x.parentFd != x.rootfd && x.parentFd != fd {
		unix.Close(x.parentFd)
	}
	x.parentRel, x.parentFd = rel, fd
}

// cleanPath turns an archive name into a clean relative path ("" for the root), or says why it
// cannot be one. A leading "./" and trailing slashes are allowed; "..", ".", empty components,
// absolute paths, NUL bytes and over-long names are not.
func cleanPath(name string) (rel, why string) {
	switch {
	case name == "":
		return "", "empty name"
	case strings.IndexByte(name, 0) >= 0:
		return "", "name contains a NUL byte"
	case len(name) >= pathMax:
		return "", fmt.Sprintf("name is %d bytes; the limit is %d (PATH_MAX)", len(name), pathMax-1)
	case name[0] == '/':
		return "", "absolute path; entries must be relative to the layer root"
	}
	for strings.HasPrefix(name, "./") {
		name = name[2:]
	}
	name = strings.TrimRight(name, "/")
	if name == "" || name == "." {
		return "", ""
	}
	if depth := strings.Count(name, "/") + 1; depth > maxDepth {
		return "", fmt.Sprintf("name is %d components deep; the limit is %d", depth, maxDepth)
	}
	for comp := range strings.SplitSeq(name, "/") {
		switch {
		case comp == "":
			return "", `empty path component ("//")`
		case comp == ".":
			return "", `"." path component`
		case comp == "..":
			return "", `".." path component; entries must stay inside the layer`
		case len(comp) > nameMax:
			return "", fmt.Sprintf("path component of %d bytes; the limit is %d (NAME_MAX)", len(comp), nameMax)
		}
	}
	return name, ""
}

// entry extracts one archive entry. data is the entry's content.
func (x *extractor) entry(hdr *tar.Header, data io.Reader) error {
	x.entries++
	if x.entries > x.cfg.MaxEntries {
		return tooLargeEntry(hdr.Name, "the layer has more than %d entries (the MaxEntries limit)", x.cfg.MaxEntries)
	}
	x.expanded += 512
	if err := x.checkRatio(); err != nil {
		return err
	}
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil // global PAX records carry nothing a layer keeps
	}
	rel, why := cleanPath(hdr.Name)
	if why != "" {
		return invalidEntry(hdr.Name, "%s", why)
	}
	if rel != "" && strings.HasPrefix(path.Base(rel), whiteoutPrefix) {
		return x.whiteoutEntry(hdr.Name, rel)
	}
	if rel == "" && hdr.Typeflag != tar.TypeDir {
		return invalidEntry(hdr.Name, "the layer root must be a directory, not %s", tarTypeName(hdr.Typeflag))
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.dir(hdr, rel)
	case tar.TypeReg, tar.TypeGNUSparse:
		return x.file(hdr, rel, data)
	case tar.TypeLink:
		return x.hardlink(hdr, rel)
	case tar.TypeSymlink:
		return x.symlink(hdr, rel)
	case tar.TypeChar, tar.TypeBlock:
		if hdr.Typeflag == tar.TypeChar && hdr.Devmajor == 0 && hdr.Devminor == 0 {
			return x.whiteout(hdr.Name, rel) // already in overlayfs form
		}
		if !x.cfg.AllowDevices {
			return invalidEntry(hdr.Name, "%s %d:%d: device nodes are not allowed in layers", tarTypeName(hdr.Typeflag), hdr.Devmajor, hdr.Devminor)
		}
		return x.special(hdr, rel)
	case tar.TypeFifo:
		return x.special(hdr, rel)
	}
	return invalidEntry(hdr.Name, "unsupported entry type %s", tarTypeName(hdr.Typeflag))
}

func tarTypeName(flag byte) string {
	switch flag {
	case tar.TypeReg:
		return "regular file"
	case tar.TypeLink:
		return "hardlink"
	case tar.TypeSymlink:
		return "symlink"
	case tar.TypeChar:
		return "character device"
	case tar.TypeBlock:
		return "block device"
	case tar.TypeDir:
		return "directory"
	case tar.TypeFifo:
		return "fifo"
	case tar.TypeCont:
		return "contiguous file ('7')"
	case tar.TypeGNUSparse:
		return "sparse file"
	}
	return fmt.Sprintf("%q", flag)
}

// checkRatio refuses an archive that expands far more than the bytes read so far.
func (x *extractor) checkRatio() error {
	if x.expanded <= x.cfg.RatioFloor {
		return nil
	}
	in := max(x.in.n, 1)
	if x.expanded/in > x.cfg.MaxRatio {
		return tooLargeArchive("archive expands more than %d times (%d bytes from %d read); refusing a likely decompression bomb (the MaxRatio limit)",
			x.cfg.MaxRatio, x.expanded, in)
	}
	return nil
}

// openBeneath opens rel ("" for the root) under the root without following any symlink.
func (x *extractor) openBeneath(rel string, flags uint64) (int, error) {
	if rel == "" {
		rel = "."
	}
	how := unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Resolve: resolveBeneath}
	for tries := 0; ; tries++ {
		fd, err := unix.Openat2(x.rootfd, rel, &how)
		// EAGAIN means a concurrent rename raced the lookup; nothing else renames in a staging
		// tree, but retrying is the documented answer.
		if err == unix.EINTR || (err == unix.EAGAIN && tries < 8) {
			continue
		}
		return fd, err
	}
}

// parent returns an O_PATH fd of the directory holding rel, creating missing directories on the
// way, and rel's last name. The fd belongs to x.
func (x *extractor) parent(entry, rel string) (int, string, error) {
	dir, name := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == x.parentRel {
		return x.parentFd, name, nil
	}
	fd, err := x.openBeneath(dir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		if fd, err = x.mkdirAll(entry, dir); err != nil {
			return -1, "", err
		}
	}
	x.setParent(dir, fd)
	return fd, name, nil
}

// mkdirAll walks rel one component at a time from the root, creating missing directories (mode
// 0755, owned by the importing user) and replacing whiteouts, and returns an O_PATH fd of rel.
// It refuses to pass through a symlink or a non-directory.
func (x *extractor) mkdirAll(entry, rel string) (int, error) {
	cur, curRel := x.rootfd, ""
	done := func(fd int) {
		if fd != x.rootfd {
			unix.Close(fd)
		}
	}
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveBeneath}
	opaqueNew := false
	for comp := range strings.SplitSeq(rel, "/") {
		compRel := joinRel(curRel, comp)
		next, err := unix.Openat2(cur, comp, &how)
		if err == unix.ENOTDIR || err == unix.ELOOP {
			var st unix.Stat_t
			if serr := unix.Fstatat(cur, comp, &st, unix.AT_SYMLINK_NOFOLLOW); serr != nil {
				done(cur)
				return -1, fmt.Errorf("lstat %s: %w", compRel, serr)
			}
			switch {
			case st.Mode&unix.S_IFMT == unix.S_IFLNK:
				done(cur)
				return -1, invalidEntry(entry, "path component %q is a symlink; entries are never created through symlinks", compRel)
			case isWhiteout(&st):
				// A later entry of the same layer wins over a whiteout of the same name; the
				// directory that replaces it is new: opaque, hiding the lower layers' one.
				if err = unix.Unlinkat(cur, comp, 0); err == nil {
					err = unix.ENOENT
					opaqueNew = true
				}
			default:
				done(cur)
				return -1, invalidEntry(entry, "parent %q is a %s, not a directory", compRel, typeName(st.Mode&unix.S_IFMT))
			}
		}
		if err == unix.ENOENT {
			if err = mkdirImplicit(cur, comp); err == nil {
				next, err = unix.Openat2(cur, comp, &how)
			}
			if err == nil && opaqueNew {
				err = unix.Setxattr(procFD(next), opaqueXattr, []byte("y"), 0)
			}
			opaqueNew = false
		}
		done(cur)
		if err != nil {
			return -1, fmt.Errorf("create directory %s: %w", compRel, err)
		}
		cur, curRel = next, compRel
	}
	return cur, nil
}

// mkdirImplicit creates a directory the archive did not list.
func mkdirImplicit(dirfd int, name string) error {
	if err := unix.Mkdirat(dirfd, name, 0o755); err != nil {
		return err
	}
	return unix.Fchmodat(dirfd, name, 0o755, 0) // undo the umask
}

// replace prepares dirfd/name for a new entry of type want (an S_IF* value): it reports whether a
// directory is already there (want == S_IFDIR; the entries merge), removes a whiteout or an older
// entry of the same type (the later entry wins, as with tar), and refuses a change of type.
func (x *extractor) replace(entry string, dirfd int, name string, want uint32) (exists bool, err error) {
	var st unix.Stat_t
	err = unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err == unix.ENOENT {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("lstat %s: %w", entry, err)
	}
	have := st.Mode & unix.S_IFMT
	switch {
	case isWhiteout(&st):
	case have != want:
		return false, invalidEntry(entry, "duplicate entry: already a %s, now a %s; a repeated entry must keep its type", typeName(have), typeName(want))
	case want == unix.S_IFDIR:
		return true, nil
	}
	if err := unix.Unlinkat(dirfd, name, 0); err != nil {
		return false, fmt.Errorf("replace %s: %w", entry, err)
	}
	return false, nil
}

// owner validates the numeric owner of an entry.
func owner(hdr *tar.Header) (int, int, error) {
	if hdr.Uid < 0 || hdr.Uid > maxID {
		return 0, 0, invalidEntry(hdr.Name, "uid %d is out of range", hdr.Uid)
	}
	if hdr.Gid < 0 || hdr.Gid > maxID {
		return 0, 0, invalidEntry(hdr.Name, "gid %d is out of range", hdr.Gid)
	}
	return hdr.Uid, hdr.Gid, nil
}

// mode returns the permission bits to set, with setuid/setgid stripped from non-directories
// unless the store keeps them.
func (x *extractor) mode(hdr *tar.Header, dir bool) uint32 {
	m := uint32(hdr.Mode) & 0o7777
	if !dir && x.cfg.SetID == SetIDStrip {
		m &^= unix.S_ISUID | unix.S_ISGID
	}
	return m
}

// xattrs returns the extended attributes of an entry to set, sorted by name. It refuses those that
// steer overlayfs and notes the ones a layer does not keep (security.selinux, ACLs, ...).
func (x *extractor) xattrs(hdr *tar.Header, dir bool) ([]xattr, error) {
	var out []xattr
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok {
			continue
		}
		switch {
		case name == "" || len(name) > nameMax:
			return nil, invalidEntry(hdr.Name, "extended attribute name of %d bytes", len(name))
		case len(v) > maxXattrValue:
			return nil, invalidEntry(hdr.Name, "extended attribute %q is %d bytes; the limit is %d", name, len(v), maxXattrValue)
		case name == opaqueXattr:
			if !dir || v != "y" {
				return nil, invalidEntry(hdr.Name, "%s is only accepted as \"y\" on a directory", opaqueXattr)
			}
		case strings.HasPrefix(name, "trusted.overlay.") || strings.HasPrefix(name, "user.overlay."):
			return nil, invalidEntry(hdr.Name, "extended attribute %q is not allowed: trusted.overlay.* and user.overlay.* steer overlayfs", name)
		case !keepXattr(name), name == capabilityXattr && x.cfg.SetID == SetIDStrip:
			// File capabilities are privilege as setuid is, and go with it (Config.SetID);
			// other security.* (SELinux labels, IMA, EVM) and trusted.* are no layer's to set.
			x.dropped[name]++
			continue
		}
		out = append(out, xattr{name: name, value: []byte(v)})
	}
	slices.SortFunc(out, func(a, b xattr) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

// setXattrs sets an entry's attributes with set. The kernel's refusals are the archive's fault:
// user.* on a symlink or fifo (EPERM), a malformed security.capability (EINVAL), more attributes
// than fit beside the inode (ENOSPC or E2BIG on ext4).
func setXattrs(entry string, attrs []xattr, set func(xattr) error) error {
	for _, a := range attrs {
		err := set(a)
		switch {
		case err == nil:
		case err == unix.EPERM || err == unix.EINVAL || err == unix.ENOSPC || err == unix.E2BIG ||
			err == unix.ERANGE || err == unix.ENOTSUP:
			return invalidEntry(entry, "the filesystem refused extended attribute %q: %v", a.name, err)
		default:
			return fmt.Errorf("set xattr %s on %s: %w", a.name, entry, err)
		}
	}
	return nil
}

// timespecs returns the atime (the mtime when the archive has none) and mtime of an entry.
func timespecs(hdr *tar.Header) []unix.Timespec {
	atime := hdr.AccessTime
	if atime.IsZero() {
		atime = hdr.ModTime
	}
	return []unix.Timespec{
		{Sec: atime.Unix(), Nsec: int64(atime.Nanosecond())},
		{Sec: hdr.ModTime.Unix(), Nsec: int64(hdr.ModTime.Nanosecond())},
	}
}

// dir creates or updates a directory. Its mode and times are applied by finish.
func (x *extractor) dir(hdr *tar.Header, rel string) error {
	uid, gid, err := owner(hdr)
	if err != nil {
		return err
	}
	attrs, err := x.xattrs(hdr, true)
	if err != nil {
		return err
	}
	dfd := x.rootfd
	if rel != "" {
		pfd, name, err := x.parent(hdr.Name, rel)
		if err != nil {
			return err
		}
		// A directory that replaces a whiteout of the same layer is new: opaque, so the lower
		// layers' directory of that name does not show through (OCI image spec, whiteouts).
		var wst unix.Stat_t
		overWhiteout := unix.Fstatat(pfd, name, &wst, unix.AT_SYMLINK_NOFOLLOW) == nil && isWhiteout(&wst)
		exists, err := x.replace(hdr.Name, pfd, name, unix.S_IFDIR)
		if err != nil {
			return err
		}
		if overWhiteout {
			attrs = append(attrs, xattr{name: opaqueXattr, value: []byte("y")})
		}
		if !exists {
			// 0700 until finish applies the archive's mode: the extraction must be able to write
			// into a directory the archive makes read-only.
			if err := unix.Mkdirat(pfd, name, 0o700); err != nil {
				return fmt.Errorf("mkdir %s: %w", rel, err)
			}
		}
		if dfd, err = unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err != nil {
			return fmt.Errorf("open %s: %w", rel, err)
		}
		defer unix.Close(dfd)
	}
	if err := unix.Fchown(dfd, uid, gid); err != nil {
		return fmt.Errorf("chown %s: %w", hdr.Name, err)
	}
	if err := setXattrs(hdr.Name, attrs, func(a xattr) error { return unix.Fsetxattr(dfd, a.name, a.value, 0) }); err != nil {
		return err
	}
	meta := dirMeta{rel: rel, mode: x.mode(hdr, true), atime: hdr.AccessTime, mtime: hdr.ModTime}
	if meta.atime.IsZero() {
		meta.atime = meta.mtime
	}
	if i, ok := x.dirs[rel]; ok {
		x.dirMeta[i] = meta
	} else {
		x.dirs[rel] = len(x.dirMeta)
		x.dirMeta = append(x.dirMeta, meta)
	}
	return nil
}

// file writes a regular file, hashing its content on the way.
func (x *extractor) file(hdr *tar.Header, rel string, data io.Reader) error {
	if hdr.Size > x.cfg.MaxBytes-x.content {
		return tooLargeEntry(hdr.Name, "a file of %d bytes takes the layer past %d bytes of content (the MaxBytes limit)", hdr.Size, x.cfg.MaxBytes)
	}
	uid, gid, err := owner(hdr)
	if err != nil {
		return err
	}
	attrs, err := x.xattrs(hdr, false)
	if err != nil {
		return err
	}
	pfd, name, err := x.parent(hdr.Name, rel)
	if err != nil {
		return err
	}
	if _, err := x.replace(hdr.Name, pfd, name, unix.S_IFREG); err != nil {
		return err
	}
	fd, err := unix.Openat(pfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", rel, err)
	}
	defer unix.Close(fd)
	sum, err := x.copyContent(hdr, fd, data)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", rel, err)
	}
	x.hashes[fileID{st.Dev, st.Ino}] = sum
	// chown clears setuid/setgid and security.capability, so it goes first.
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return fmt.Errorf("chown %s: %w", rel, err)
	}
	if err := unix.Fchmod(fd, x.mode(hdr, false)); err != nil {
		return fmt.Errorf("chmod %s: %w", rel, err)
	}
	if err := setXattrs(hdr.Name, attrs, func(a xattr) error { return unix.Fsetxattr(fd, a.name, a.value, 0) }); err != nil {
		return err
	}
	if err := unix.UtimesNanoAt(pfd, name, timespecs(hdr), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %s: %w", rel, err)
	}
	return nil
}

// copyContent copies an entry's content into fd and returns its SHA-256.
func (x *extractor) copyContent(hdr *tar.Header, fd int, data io.Reader) ([sha256.Size]byte, error) {
	h := sha256.New()
	var sum [sha256.Size]byte
	var written int64
	for {
		n, rerr := data.Read(x.buf)
		if n > 0 {
			chunk := x.buf[:n]
			h.Write(chunk)
			for len(chunk) > 0 {
				m, err := unix.Write(fd, chunk)
				if err == unix.EINTR {
					continue
				}
				if err != nil {
					return sum, fmt.Errorf("write %s: %w", hdr.Name, err)
				}
				chunk = chunk[m:]
			}
			written += int64(n)
			x.content += int64(n)
			x.expanded += int64(n)
			if err := x.checkRatio(); err != nil {
				return sum, err
			}
			if err := x.ctx.Err(); err != nil {
				return sum, err
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return sum, readError(rerr) // truncation, corruption, cancellation, the caller's reader
		}
	}
	if written != hdr.Size {
		return sum, invalidEntry(hdr.Name, "content is %d bytes, header says %d", written, hdr.Size)
	}
	h.Sum(sum[:0])
	return sum, nil
}

// hardlink links rel to an entry extracted earlier.
func (x *extractor) hardlink(hdr *tar.Header, rel string) error {
	trel, why := cleanPath(hdr.Linkname)
	switch {
	case why != "":
		return invalidEntry(hdr.Name, "hardlink target %q: %s", hdr.Linkname, why)
	case trel == "":
		return invalidEntry(hdr.Name, "hardlink to the layer root")
	}
	notFound := func() error {
		return invalidEntry(hdr.Name, "hardlink target %q is not in the layer; a hardlink must point to an entry earlier in the archive", hdr.Linkname)
	}
	tdir, tname := path.Split(trel)
	tfd, err := x.openBeneath(strings.TrimSuffix(tdir, "/"), unix.O_PATH|unix.O_DIRECTORY)
	switch {
	case err == unix.ELOOP:
		return invalidEntry(hdr.Name, "hardlink target %q goes through a symlink", hdr.Linkname)
	case err == unix.ENOENT || err == unix.ENOTDIR:
		return notFound()
	case err != nil:
		return fmt.Errorf("open %s: %w", tdir, err)
	}
	defer unix.Close(tfd)
	var tst unix.Stat_t
	err = unix.Fstatat(tfd, tname, &tst, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == unix.ENOENT:
		return notFound()
	case err != nil:
		return fmt.Errorf("lstat %s: %w", trel, err)
	case tst.Mode&unix.S_IFMT == unix.S_IFDIR:
		return invalidEntry(hdr.Name, "hardlink target %q is a directory", hdr.Linkname)
	case isWhiteout(&tst):
		return invalidEntry(hdr.Name, "hardlink target %q is a whiteout", hdr.Linkname)
	}
	pfd, name, err := x.parent(hdr.Name, rel)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Dev == tst.Dev && st.Ino == tst.Ino {
		return nil // the same link again
	}
	if _, err := x.replace(hdr.Name, pfd, name, tst.Mode&unix.S_IFMT); err != nil {
		return err
	}
	if err := unix.Linkat(tfd, tname, pfd, name, 0); err != nil {
		return fmt.Errorf("link %s to %s: %w", rel, trel, err)
	}
	return nil
}

// symlink creates a symlink. Its target is stored as written, absolute or with "..": it resolves
// inside the container, never during extraction.
func (x *extractor) symlink(hdr *tar.Header, rel string) error {
	target := hdr.Linkname
	switch {
	case target == "":
		return invalidEntry(hdr.Name, "symlink with an empty target")
	case strings.IndexByte(target, 0) >= 0:
		return invalidEntry(hdr.Name, "symlink target contains a NUL byte")
	case len(target) >= pathMax:
		return invalidEntry(hdr.Name, "symlink target is %d bytes; the limit is %d (PATH_MAX)", len(target), pathMax-1)
	}
	uid, gid, err := owner(hdr)
	if err != nil {
		return err
	}
	attrs, err := x.xattrs(hdr, false)
	if err != nil {
		return err
	}
	pfd, name, err := x.parent(hdr.Name, rel)
	if err != nil {
		return err
	}
	if _, err := x.replace(hdr.Name, pfd, name, unix.S_IFLNK); err != nil {
		return err
	}
	if err := unix.Symlinkat(target, pfd, name); err != nil {
		return fmt.Errorf("symlink %s: %w", rel, err)
	}
	return x.finishNode(hdr, pfd, name, uid, gid, 0, false, attrs)
}

// special creates a fifo or, when allowed, a device node.
func (x *extractor) special(hdr *tar.Header, rel string) error {
	typ := uint32(unix.S_IFIFO)
	var dev uint64
	switch hdr.Typeflag {
	case tar.TypeChar, tar.TypeBlock:
		if hdr.Devmajor < 0 || hdr.Devmajor > 1<<32-1 || hdr.Devminor < 0 || hdr.Devminor > 1<<32-1 {
			return invalidEntry(hdr.Name, "device number %d:%d is out of range", hdr.Devmajor, hdr.Devminor)
		}
		typ = unix.S_IFCHR
		if hdr.Typeflag == tar.TypeBlock {
			typ = unix.S_IFBLK
		}
		dev = unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
	}
	uid, gid, err := owner(hdr)
	if err != nil {
		return err
	}
	attrs, err := x.xattrs(hdr, false)
	if err != nil {
		return err
	}
	pfd, name, err := x.parent(hdr.Name, rel)
	if err != nil {
		return err
	}
	if _, err := x.replace(hdr.Name, pfd, name, typ); err != nil {
		return err
	}
	if err := unix.Mknodat(pfd, name, typ|0o600, int(dev)); err != nil {
		return fmt.Errorf("mknod %s: %w", rel, err)
	}
	return x.finishNode(hdr, pfd, name, uid, gid, x.mode(hdr, false), true, attrs)
}

// finishNode sets owner, mode (when chmod is set; symlinks have none), xattrs and times of a
// symlink, fifo or device, by name, never following it.
func (x *extractor) finishNode(hdr *tar.Header, pfd int, name string, uid, gid int, mode uint32, chmod bool, attrs []xattr) error {
	if err := unix.Fchownat(pfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown %s: %w", hdr.Name, err)
	}
	if chmod {
		// fchmodat follows symlinks, but pfd/name was just created as a fifo or device.
		if err := unix.Fchmodat(pfd, name, mode, 0); err != nil {
			return fmt.Errorf("chmod %s: %w", hdr.Name, err)
		}
	}
	if err := setXattrs(hdr.Name, attrs, func(a xattr) error { return unix.Lsetxattr(procPath(pfd, name), a.name, a.value, 0) }); err != nil {
		return err
	}
	if err := unix.UtimesNanoAt(pfd, name, timespecs(hdr), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %s: %w", hdr.Name, err)
	}
	return nil
}

// whiteoutEntry converts an OCI whiteout file (.wh.NAME, .wh..wh..opq) to overlayfs form. The
// entry's own type and metadata are ignored, as the OCI spec says.
func (x *extractor) whiteoutEntry(entry, rel string) error {
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	switch {
	case base == opaqueMarker:
		return x.opaque(entry, dir)
	case strings.HasPrefix(base, whiteoutMeta):
		// AUFS bookkeeping such as .wh..wh.plnk: no meaning for overlayfs.
		x.log.Debug("skip aufs metadata entry", "entry", entry)
		return nil
	}
	target := strings.TrimPrefix(base, whiteoutPrefix)
	if target == "" || target == "." || target == ".." {
		return invalidEntry(entry, "whiteout of %q names no entry", target)
	}
	return x.whiteout(entry, joinRel(dir, target))
}

// whiteout creates an overlayfs whiteout at rel: a 0:0 character device, mode 0, owned by the
// importing user. An entry of the same layer already at rel wins: it hides the lower one anyway.
func (x *extractor) whiteout(entry, rel string) error {
	pfd, name, err := x.parent(entry, rel)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		return nil
	} else if err != unix.ENOENT {
		return fmt.Errorf("lstat %s: %w", rel, err)
	}
	if err := unix.Mknodat(pfd, name, unix.S_IFCHR, 0); err != nil {
		return fmt.Errorf("create whiteout %s: %w", rel, err)
	}
	return nil
}

// opaque marks the directory dir ("" for the root) opaque: it hides the lower layers' contents.
func (x *extractor) opaque(entry, dir string) error {
	fd, err := x.openBeneath(dir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		if fd, err = x.mkdirAll(entry, dir); err != nil {
			return err
		}
	}
	defer unix.Close(fd)
	// setxattr (not l-) follows the /proc magic link to the directory itself.
	if err := unix.Setxattr(procFD(fd), opaqueXattr, []byte("y"), 0); err != nil {
		return fmt.Errorf("mark %q opaque: %w", dir, err)
	}
	return nil
}

// finish applies the modes and times of the directories, after all entries are written.
func (x *extractor) finish() error {
	for _, m := range x.dirMeta {
		fd, err := x.openBeneath(m.rel, unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			return fmt.Errorf("open %s: %w", m.rel, err)
		}
		ts := []unix.Timespec{
			{Sec: m.atime.Unix(), Nsec: int64(m.atime.Nanosecond())},
			{Sec: m.mtime.Unix(), Nsec: int64(m.mtime.Nanosecond())},
		}
		err = unix.Fchmodat(fd, ".", m.mode, 0)
		if err == nil {
			err = unix.UtimesNanoAt(fd, ".", ts, 0)
		}
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("set mode and times of %q: %w", m.rel, err)
		}
	}
	if len(x.dropped) > 0 {
		x.log.Warn("layer import dropped extended attributes a layer does not keep", "xattrs", x.dropped)
	}
	return nil
}
