// Package volume keeps a node's volume images: one ext4 filesystem image per volume, allocated
// in full when it is made (fallocate, so the bytes a volume is charged for are the bytes it holds
// on the host's disk), under one directory. It knows nothing of projects, attachments or mounts:
// the store records those, and the runtimes mount an image by its path (runc.Volume).
package volume

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lazyregexp"
)

// Dir holds the images of one node's volumes, <id>.ext4 each.
type Dir struct {
	dir  string
	mkfs string
}

// imageExt ends an image's name; a name ending in tmpExt is one being made.
const (
	imageExt = ".ext4"
	tmpExt   = ".tmp"
)

var idRE = lazyregexp.New(`^vol-[0-9a-f]{16}$`)

// Open opens (making it if needed) the directory dir. mkfs is mkfs.ext4's path; empty looks it
// up in PATH, /usr/sbin and /sbin.
func Open(dir, mkfs string) (*Dir, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open volume directory: %w", err)
	}
	if mkfs == "" {
		for _, p := range []string{"mkfs.ext4", "/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
			if found, err := exec.LookPath(p); err == nil {
				mkfs = found
				break
			}
		}
		if mkfs == "" {
			return nil, errors.New("open volume directory: mkfs.ext4 not found (install e2fsprogs)")
		}
	}
	return &Dir{dir: dir, mkfs: mkfs}, nil
}

// Path returns the image of the volume with this ID.
func (d *Dir) Path(id string) string { return filepath.Join(d.dir, id+imageExt) }

// Create makes the image of volume id: size bytes allocated on the host's disk and formatted
// ext4 (with a journal: a volume outlives crashes of the sandboxes and hosts that write it),
// its root directory owned by root, mode 0755. On error nothing is left.
func (d *Dir) Create(ctx context.Context, id string, size int64) (err error) {
	if !idRE.MatchString(id) {
		return errdefs.Invalid("id", "%q is not a volume ID", id)
	}
	tmp := d.Path(id) + tmpExt
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create volume image: %w", err)
	}
	defer func() {
		f.Close()
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			return fmt.Errorf("allocate %d bytes for the volume: the host's disk is full: %w", size, errdefs.ErrExhausted)
		}
		return fmt.Errorf("allocate volume image: %w", err)
	}
	// The blocks are allocated but unwritten (they read as zeros), so the inode tables need no
	// zeroing now; the journal is written in full, which a volume's crash safety needs.
	cmd := exec.CommandContext(ctx, d.mkfs, "-q", "-F", "-b", "4096", "-m", "0",
		"-E", "lazy_itable_init=1,nodiscard,root_owner=0:0", tmp)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4 volume: %w: %s", err, bytes.TrimSpace(out))
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync volume image: %w", err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, d.Path(id), unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return errdefs.Conflict("volume image %s already exists", id)
		}
		return fmt.Errorf("create volume image: %w", err)
	}
	return nil
}

// Recover replays the journal of volume id's filesystem into place, if it has one to replay:
// call it when no sandbox has the volume attached. A writer that ended without unmounting (a
// microvm's QEMU is stopped with the guest's mount in place; a host crash) leaves committed
// changes in the journal only, where a read-only mount, which replays nothing, would not see
// them. It runs e2fsck in user space: the host's kernel never replays a journal a guest wrote.
func (d *Dir) Recover(ctx context.Context, id string) error {
	if !idRE.MatchString(id) {
		return errdefs.Invalid("id", "%q is not a volume ID", id)
	}
	fsck := filepath.Join(filepath.Dir(d.mkfs), "e2fsck")
	cmd := exec.CommandContext(ctx, fsck, "-p", "-E", "journal_only", d.Path(id))
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	out, err := cmd.CombinedOutput()
	// Exit status 1: errors corrected (here: the journal replayed).
	if ee, ok := errors.AsType[*exec.ExitError](err); ok && ee.ExitCode() == 1 {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("replay volume %s's journal: %w: %s", id, err, bytes.TrimSpace(out))
	}
	return nil
}

// Remove deletes the image of volume id; one already gone is not an error.
func (d *Dir) Remove(id string) error {
	if !idRE.MatchString(id) {
		return errdefs.Invalid("id", "%q is not a volume ID", id)
	}
	if err := os.Remove(d.Path(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove volume image: %w", err)
	}
	if err := os.Remove(d.marker(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove volume image: %w", err)
	}
	return nil
}

// List returns the IDs of the images in the directory, and the names of leftovers of makes cut
// short (tmp), which the caller may remove with RemoveLeftover.
func (d *Dir) List() (ids, tmp []string, err error) {
	ents, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, nil, fmt.Errorf("list volume images: %w", err)
	}
	for _, e := range ents {
		name := e.Name()
		switch {
		case strings.HasSuffix(name, imageExt+tmpExt), strings.HasSuffix(name, imageExt+markerExt+tmpExt):
			tmp = append(tmp, name)
		case strings.HasSuffix(name, imageExt) && idRE.MatchString(strings.TrimSuffix(name, imageExt)):
			ids = append(ids, strings.TrimSuffix(name, imageExt))
		}
	}
	return ids, tmp, nil
}

// RemoveLeftover removes a leftover List reported.
func (d *Dir) RemoveLeftover(name string) error {
	if !(strings.HasSuffix(name, imageExt+tmpExt) || strings.HasSuffix(name, imageExt+markerExt+tmpExt)) || strings.ContainsRune(name, '/') {
		return errdefs.Invalid("name", "%q is not a leftover volume image", name)
	}
	return os.Remove(filepath.Join(d.dir, name))
}

// Bytes returns the bytes the directory's images hold on the host's disk (allocated blocks),
// for the node's disk admission to count.
func (d *Dir) Bytes() (int64, error) {
	ents, err := os.ReadDir(d.dir)
	if err != nil {
		return 0, fmt.Errorf("volume bytes: %w", err)
	}
	var n int64
	for _, e := range ents {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(d.dir, e.Name()), &st); err == nil {
			n += st.Blocks * 512
		}
	}
	return n, nil
}
