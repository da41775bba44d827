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
