package runc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime"
)

// Volumes. A volume is an ext4 filesystem image on the host (the edge makes and keeps it; see
// internal/volume). A runc or gVisor sandbox mounts it through a loop device of its own at
// <dir>/vol/<i> (read-only: the loop device and the mount both), and the bundle binds that
// directory at the volume's path: one mount entry per volume, after every other, so nothing
// mounts over it and a change to the user mapping can treat the volumes as entries of their
// own. The mount lives under <dir>, so Delete's unmount of everything under <dir> detaches it,
// and the loop device (autoclear) goes with its mount. A microvm gets the image as a virtio-blk
// disk instead (internal/runtime/qemu) and its guest mounts it.
//
// The mountpoint inside the rootfs is made by the runtime before the sandbox starts, with no
// symlink followed (openat2 RESOLVE_NO_SYMLINKS beneath the rootfs): an image whose /data is a
// symlink to /proc, /, or anywhere else, is refused rather than followed. Nothing in the
// sandbox runs yet, and the layers below the overlay are read-only, so the check cannot race.

// checkVolumes validates s.Volumes: paths, images, no path twice or under another.
func checkVolumes(vols []runtime.Volume) error {
	if len(vols) > runtime.MaxVolumes {
		return errdefs.Invalid("Volumes", "%d volumes, at most %d", len(vols), runtime.MaxVolumes)
	}
	for i, v := range vols {
		if err := runtime.CheckVolumePath("Volumes.Path", v.Path); err != nil {
			return err
		}
		if !filepath.IsAbs(v.Image) {
			return errdefs.Invalid("Volumes.Image", "%q is not an absolute path", v.Image)
		}
		for _, o := range vols[:i] {
			if o.Path == v.Path || strings.HasPrefix(v.Path, o.Path+"/") || strings.HasPrefix(o.Path, v.Path+"/") {
				return errdefs.Invalid("Volumes.Path", "%s and %s overlap", o.Path, v.Path)
			}
		}
	}
	return nil
}

// volumeDir is where a sandbox's i-th volume is mounted on the host.
func volumeDir(dir string, i int) string { return filepath.Join(dir, "vol", strconv.Itoa(i)) }

// bindDir is where the host-side sources of a sandbox's binds (its volumes' mount points under
// vol/, its /etc/hosts under etc/) live: its state directory dir, or with a user namespace (ux)
// its root directory under RootsDir, which the sandbox's root can search, so that runc's init
// binds them itself instead of asking runc's parent for each source (as for LXCFS's files,
// whose view is open for the same reason).
func bindDir(dir string, ux *usernsSpec) string {
	if ux != nil {
		return filepath.Dir(ux.rootfs)
	}
	return dir
}

// mountVolumes mounts s's volumes under dir (volumeDir) and makes their mountpoints in rootfs
// with mkdir (inroot.Mkdir in rootfs, as the sandbox's root when it has a user namespace).
// On error the caller's teardown of dir removes what was mounted.
func mountVolumes(dir, rootfs string, vols []runtime.Volume, mkdir func(p string, follow bool) error) error {
	for i, v := range vols {
		if err := mkdir(v.Path, false); err != nil {
			return fmt.Errorf("volume at %s: %w", v.Path, err)
		}
		mnt := volumeDir(dir, i)
		// vol/ is searchable (its mount points are not readable): under a root directory the
		// sandbox's root reaches its volumes through it.
		if err := os.MkdirAll(filepath.Dir(mnt), 0o711); err != nil {
			return err
		}
		if err := os.Mkdir(mnt, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		if err := mountVolume(v.Image, mnt, v.ReadOnly); err != nil {
			return fmt.Errorf("volume at %s: %w", v.Path, err)
		}
	}
	return nil
}

// mountVolume mounts the ext4 image at mnt through a loop device of its own (autoclear: it goes
// with the mount).
func mountVolume(image, mnt string, readOnly bool) error {
	flag := os.O_RDWR
	if readOnly {
		flag = os.O_RDONLY
	}
	f, err := os.OpenFile(image, flag|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open volume image: %w", err)
	}
	defer f.Close()
	loop, err := attachLoopMode(f, readOnly)
	if err != nil {
		return err
	}
	defer loop.Close()
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOATIME)
	data := ""
	if readOnly {
		// noload: a read-only mount replays no journal, so it writes nothing to the image.
		flags |= unix.MS_RDONLY
		data = "noload"
	}
	if err := unix.Mount(loop.Name(), mnt, "ext4", flags, data); err != nil {
		return fmt.Errorf("mount %s on %s: %w", loop.Name(), mnt, err)
	}
	return nil
}

// volumeMounts are the bundle's mount entries of s's volumes, sources under dir.
func volumeMounts(dir string, s *Spec) []specs.Mount {
	var out []specs.Mount
	for i, v := range s.Volumes {
		opts := []string{"bind", "nosuid", "nodev"}
		if v.ReadOnly {
			opts = append(opts, "ro")
		}
		out = append(out, specs.Mount{Destination: v.Path, Type: "bind", Source: volumeDir(dir, i), Options: opts})
	}
	return out
}

// hostsMount writes the sandbox's /etc/hosts (agentrpc.HostsFile) and returns its bind mount.
// The file lives on a small tmpfs of the sandbox's own at dir/etc (dir: the sandbox's state
// directory, or its root directory with a user namespace; unmounted with it), so the
// sandbox's mountinfo shows "/hosts" as the mount's root, not a path of the host's. As in
// Docker, the sandbox's root may add entries: the file is writable and owned by
// owner (the host uid and gid of the sandbox's root; 0 without a user namespace), and the
// tmpfs bounds what it can grow to (64 KiB, charged to the sandbox's memory).
func hostsMount(dir string, owner uint32) (specs.Mount, error) {
	etc := filepath.Join(dir, "etc")
	if err := os.Mkdir(etc, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return specs.Mount{}, fmt.Errorf("write /etc/hosts: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(etc, &st); err != nil {
		return specs.Mount{}, fmt.Errorf("write /etc/hosts: %w", err)
	}
	if st.Type != unix.TMPFS_MAGIC {
		if err := unix.Mount("corral-etc", etc, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=64k,nr_inodes=16,mode=0755"); err != nil {
			return specs.Mount{}, fmt.Errorf("write /etc/hosts: mount a tmpfs at %s: %w", etc, err)
		}
	}
	path := filepath.Join(etc, "hosts")
	if err := os.WriteFile(path, []byte(agentrpc.HostsFile()), 0o644); err != nil {
		return specs.Mount{}, fmt.Errorf("write /etc/hosts: %w", err)
	}
	// Every user inside reads it, whatever the daemon's umask took off.
	if err := os.Chmod(path, 0o644); err != nil {
		return specs.Mount{}, fmt.Errorf("write /etc/hosts: %w", err)
	}
	if err := os.Chown(path, int(owner), int(owner)); err != nil {
		return specs.Mount{}, fmt.Errorf("write /etc/hosts: %w", err)
	}
	return specs.Mount{Destination: "/etc/hosts", Type: "bind", Source: path, Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"}}, nil
}

// idmapVolumes replaces each of the n volume mounts under dir (volumeDir) with a copy idmapped
// with the user namespace ns, so the sandbox's root owns what the host's root owns on disk.
func idmapVolumes(dir string, n int, ns *os.File) error {
	for i := 0; i < n; i++ {
		mnt := volumeDir(dir, i)
		fd, err := idmappedTree(mnt, ns)
		if err != nil {
			return fmt.Errorf("volume %d: %w", i, err)
		}
		// The detached copy holds the filesystem, so the plain mount can go first.
		err = unix.Unmount(mnt, unix.MNT_DETACH)
		if err == nil {
			err = unix.MoveMount(fd, "", unix.AT_FDCWD, mnt, unix.MOVE_MOUNT_F_EMPTY_PATH)
		}
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("volume %d: idmapped mount at %s: %w", i, mnt, err)
		}
	}
	return nil
}
