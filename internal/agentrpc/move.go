package agentrpc

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// openInRoot opens the clean absolute path p as the sandbox sees it, for the agent's own use.
// Symbolic links are followed but scoped to the agent's root (RESOLVE_IN_ROOT: ".." and
// absolute targets stop at /), and links into /proc's per-process views (/proc/PID/root,
// /proc/PID/cwd, /proc/PID/fd/N) are refused (RESOLVE_NO_MAGICLINKS): a path the sandbox made
// can lead the agent neither above its root nor into another mount namespace's files (a call's,
// in a calls agent). Where openat2 is missing, open(2) is used, which the kernel still confines to
// the agent's root but which does follow magic links.
func openInRoot(p string, flags int) (int, error) {
	if !openat2Missing.Load() {
		root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		defer unix.Close(root)
		rel := strings.TrimPrefix(p, "/")
		if rel == "" {
			rel = "."
		}
		fd, err := unix.Openat2(root, rel, &unix.OpenHow{
			Flags:   uint64(flags | unix.O_CLOEXEC),
			Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
		})
		if err != unix.ENOSYS {
			return fd, err
		}
		openat2Missing.Store(true)
	}
	return unix.Open(p, flags|unix.O_CLOEXEC, 0)
}

// openDirInRoot opens the directory dir (for the *at calls: O_PATH) with openInRoot and explains
// a failure in terms of field.
func openDirInRoot(field, dir string) (int, error) {
	fd, err := openInRoot(dir, unix.O_PATH|unix.O_DIRECTORY)
	switch err {
	case nil:
		return fd, nil
	case unix.ENOENT:
		return -1, errdefs.NotFound("%s: directory %s does not exist", field, dir)
	case unix.ENOTDIR:
		return -1, errdefs.Invalid(field, "%s is not a directory", dir)
	case unix.ELOOP:
		return -1, errdefs.Invalid(field, "%s goes through a link into /proc (such as /proc/PID/root) or too many symbolic links: refused", dir)
	}
	return -1, &os.PathError{Op: "open", Path: dir, Err: err}
}

// move renames source to destination as rename(2) does: a file or an empty directory at
// destination is replaced, a non-empty one is not; the parent of destination must exist. Both
// paths are resolved with openInRoot up to their parents, and their last components are not
// followed (a symbolic link is moved or replaced itself). It returns the destination's FileInfo.
func move(source, destination string) (FileInfo, error) {
	src, err := cleanPath("source", source)
	if err != nil {
		return FileInfo{}, err
	}
	dst, err := cleanPath("destination", destination)
	if err != nil {
		return FileInfo{}, err
	}
	switch {
	case src == "/":
		return FileInfo{}, errdefs.Invalid("source", "refusing to move /")
	case dst == "/":
		return FileInfo{}, errdefs.Invalid("destination", "refusing to replace /")
	case strings.HasPrefix(dst, src+"/"):
		return FileInfo{}, errdefs.Invalid("destination", "%s is inside %s: a directory cannot be moved into itself", dst, src)
	}
	srcDir, srcBase := filepath.Split(src)
	dstDir, dstBase := filepath.Split(dst)
	sfd, err := openDirInRoot("source", filepath.Clean(srcDir))
	if err != nil {
		return FileInfo{}, err
	}
	defer unix.Close(sfd)
	dfd, err := openDirInRoot("destination", filepath.Clean(dstDir))
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return FileInfo{}, errdefs.NotFound("move to %s: parent directory %s does not exist (create it first)", dst, filepath.Clean(dstDir))
		}
		return FileInfo{}, err
	}
	defer unix.Close(dfd)
	switch err := unix.Renameat(sfd, srcBase, dfd, dstBase); err {
	case nil:
	case unix.ENOENT:
		return FileInfo{}, errdefs.NotFound("move %s: no such file or directory", src)
	case unix.EXDEV:
		return FileInfo{}, crossMountError(sfd, srcBase, dfd, src, dst)
	case unix.EISDIR:
		return FileInfo{}, errdefs.Conflict("move %s to %s: the destination is a directory and the source is not", src, dst)
	case unix.ENOTDIR:
		return FileInfo{}, errdefs.Conflict("move %s to %s: the source is a directory and the destination is not", src, dst)
	case unix.ENOTEMPTY, unix.EEXIST:
		return FileInfo{}, errdefs.Conflict("move %s to %s: the destination is a directory that is not empty", src, dst)
	case unix.EBUSY:
		return FileInfo{}, errdefs.Conflict("move %s to %s: one of them is a mount point", src, dst)
	case unix.EINVAL:
		return FileInfo{}, errdefs.Invalid("destination", "cannot move %s to %s (a directory into itself?)", src, dst)
	default:
		return FileInfo{}, &os.LinkError{Op: "rename", Old: src, New: dst, Err: err}
	}
	return fileInfoAt(dfd, dstBase, dst)
}

// crossMountError explains an EXDEV from rename: the two paths are on different mounts, or (same
// mount) the filesystem cannot rename that entry in place, as overlayfs cannot rename a directory
// that comes from a lower layer.
func crossMountError(sfd int, srcBase string, dfd int, src, dst string) error {
	var a, b unix.Statx_t
	const mask = unix.STATX_MNT_ID
	errA := unix.Statx(sfd, srcBase, unix.AT_SYMLINK_NOFOLLOW, mask, &a)
	errB := unix.Statx(dfd, "", unix.AT_EMPTY_PATH, mask, &b)
	same := false
	if errA == nil && errB == nil {
		if a.Mask&b.Mask&unix.STATX_MNT_ID != 0 {
			same = a.Mnt_id == b.Mnt_id
		} else {
			same = a.Dev_major == b.Dev_major && a.Dev_minor == b.Dev_minor
		}
	}
	if !same {
		return errdefs.Invalid("destination", "%s and %s are on different mounts; a move stays within one filesystem (copy, then remove the source)", src, dst)
	}
	return errdefs.Invalid("source", "%s cannot be renamed in place by its filesystem (on the sandbox's root, a directory that comes from one of its layers); copy it, then remove it", src)
}

// fileInfoAt describes the entry base of the directory dirfd (not following a symbolic link);
// p is its path for the answer.
func fileInfoAt(dirfd int, base, p string) (FileInfo, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return FileInfo{}, &os.PathError{Op: "stat", Path: p, Err: err}
	}
	mode := fs.FileMode(st.Mode & 0o777)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	}
	if st.Mode&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if st.Mode&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if st.Mode&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	out := FileInfo{
		Name: filepath.Base(p), Path: p, Size: st.Size, Mode: mode,
		ModTime: time.Unix(st.Mtim.Unix()), IsDir: mode.IsDir(), UID: int(st.Uid), GID: int(st.Gid),
	}
	if mode&fs.ModeSymlink != 0 {
		buf := make([]byte, unix.PathMax)
		if n, err := unix.Readlinkat(dirfd, base, buf); err == nil {
			out.Link = string(buf[:n])
		}
	}
	return out, nil
}
