package runc

import (
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime"
)

// usedBytes is how much of the filesystem at dir is in use (statfs: blocks less free blocks).
func usedBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize, nil
}

// Usage reads what a container sandbox uses now: its cgroups, and the bytes in use on its
// writable disk (the ext4 filesystem holding the overlay's upper directory).
func (r *Runtime) Usage(id string) (runtime.Usage, error) {
	if !validID(id) {
		return runtime.Usage{}, errdefs.Invalid("ID", "%q is not a valid sandbox ID", id)
	}
	u, err := r.cg.Usage(id)
	if err != nil {
		return u, err
	}
	if n, err := usedBytes(filepath.Join(r.dir(id), diskMount)); err == nil {
		u.DiskBytes = n
	}
	return u, nil
}
