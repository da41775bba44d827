// Package inroot makes directories inside a container's root filesystem from outside it (the
// host, or a VM's init before it switches root) without ever resolving a path onto anything
// outside that root: the mountpoints of volumes and an image's missing working directory.
package inroot

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Mkdir makes the directory p (absolute, clean) inside root, root-owned with mode 0755
// where missing, as Docker makes a missing working directory. follow resolves symlinks as the
// sandbox would (scoped to root: RESOLVE_IN_ROOT); without it any symlink on the way is refused.
// Either way nothing outside root is touched.
func Mkdir(root, p string, follow bool) error {
	rootfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open root: %w", err)
	}
	defer unix.Close(rootfd)
	resolve := uint64(unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV)
	if !follow {
		resolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_XDEV
	}
	open := func(rel string) (int, error) {
		return unix.Openat2(rootfd, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolve})
	}
	rel := strings.TrimPrefix(p, "/")
	if rel == "" {
		return nil
	}
	parts := strings.Split(rel, "/")
	for i := range parts {
		prefix := strings.Join(parts[:i+1], "/")
		fd, err := open(prefix)
		if err == nil {
			unix.Close(fd)
			continue
		}
		switch {
		case errors.Is(err, unix.ELOOP):
			return errdefs.Invalid("path", "/%s is a symlink in the sandbox's image; mount at a real directory", prefix)
		case errors.Is(err, unix.ENOTDIR):
			return errdefs.Invalid("path", "/%s is not a directory in the sandbox's image", prefix)
		case errors.Is(err, unix.EXDEV):
			return errdefs.Invalid("path", "/%s crosses a mount in the sandbox's root", prefix)
		case !errors.Is(err, unix.ENOENT):
			return fmt.Errorf("open /%s: %w", prefix, err)
		}
		parent := rootfd
		if i > 0 {
			if parent, err = open(strings.Join(parts[:i], "/")); err != nil {
				return fmt.Errorf("open /%s: %w", strings.Join(parts[:i], "/"), err)
			}
		}
		err = unix.Mkdirat(parent, parts[i], 0o755)
		if err == nil {
			// Owner root, mode 0755 whatever the umask.
			err = unix.Fchmodat(parent, parts[i], 0o755, 0)
		}
		if parent != rootfd {
			unix.Close(parent)
		}
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("make /%s: %w", prefix, err)
		}
		// Checked again on the next turn (or below, for the last part).
		if i == len(parts)-1 {
			fd, err := open(prefix)
			if err != nil {
				return fmt.Errorf("open /%s: %w", prefix, err)
			}
			unix.Close(fd)
		}
	}
	return nil
}

// CheckLayers reports, from the layer directories an overlay of lower (bottom first) would
// merge, whether p could be made as Mkdir(root, p, false) makes it in that overlay: no
// component of p is a symlink or a non-directory in the layer that shows it. An entry a layer
// whites out (a 0/0 character device) hides what lies below; anything deeper than an absent
// component is absent. It reads the layers with openat2 and no symlink followed, so a layer's
// own links never lead it onto the host. A VM, which mounts its layers itself, is checked with
// it before it boots.
func CheckLayers(lower []string, p string) error {
	rel := strings.TrimPrefix(p, "/")
	if rel == "" {
		return nil
	}
	fds := make([]int, len(lower))
	for i, l := range lower {
		fd, err := unix.Open(l, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			for _, f := range fds[:i] {
				unix.Close(f)
			}
			return fmt.Errorf("open layer: %w", err)
		}
		fds[i] = fd
	}
	defer func() {
		for _, f := range fds {
			unix.Close(f)
		}
	}()
	parts := strings.Split(rel, "/")
	// below is how many layers, from the bottom, can show the next component: none above the
	// one that shows its parent has the parent at all.
	below := len(fds)
	for i := range parts {
		prefix := strings.Join(parts[:i+1], "/")
		found := false
		for j := below - 1; j >= 0; j-- {
			fd, err := unix.Openat2(fds[j], prefix, &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
				Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_XDEV})
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) && i > 0 {
				continue // not in this layer (or under something this layer does not show)
			}
			if err != nil && !errors.Is(err, unix.ELOOP) {
				return fmt.Errorf("look up /%s: %w", prefix, err)
			}
			var st unix.Stat_t
			if err == nil {
				err = unix.Fstat(fd, &st)
				unix.Close(fd)
				if err != nil {
					return fmt.Errorf("look up /%s: %w", prefix, err)
				}
			} else {
				st.Mode = unix.S_IFLNK // the last component itself is a symlink (O_NOFOLLOW with O_PATH opens it; ELOOP otherwise)
			}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFLNK:
				return errdefs.Invalid("path", "/%s is a symlink in the sandbox's image; mount at a real directory", prefix)
			case unix.S_IFDIR:
			case unix.S_IFCHR:
				if st.Rdev == 0 {
					return nil // whited out: absent from here down
				}
				fallthrough
			default:
				return errdefs.Invalid("path", "/%s is not a directory in the sandbox's image", prefix)
			}
			found, below = true, j+1
			break
		}
		if !found {
			return nil
		}
	}
	return nil
}
