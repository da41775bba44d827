//go:build linux

package erofs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Backing kinds.
const (
	BackingFile = "file" // the kernel reads the image file directly (Linux 6.12+)
	BackingLoop = "loop" // through a read-only loop device
)

// Backing says how Mount mounted an image.
type Backing struct {
	Kind   string // BackingFile or BackingLoop
	Device string // the loop device ("/dev/loop3") when Kind is BackingLoop; "" otherwise
	// Devices are the loop devices of MountOptions.Devices, in order, when Kind is BackingLoop;
	// nil otherwise.
	Devices []string
	// DirectIO is true when reads bypass the page cache of the image file and of every extra
	// device file (the file-backed mount's "directio" option, or direct-I/O loop devices), so file
	// data is cached once, by EROFS.
	DirectIO bool
}

// MountOptions adjusts Mount.
type MountOptions struct {
	// ForceLoop skips the file-backed attempt and mounts through a loop device. Tests use it to
	// exercise the fallback on kernels where file-backed mounts work.
	ForceLoop bool
	// Devices are the files of the image's extra devices, in order: for an image from BuildSplit,
	// its data blob. They must be regular files, as the image must; they may lie on FUSE even
	// where the image may not (the kernel's stacking check covers the image only).
	Devices []string
}

// mountAttrs are the flags of every mount: read-only, and no setuid, devices or exec through this
// mount itself. overlayfs checks only its own mount's flags (the stacking test checks it), so the
// sandboxes that use the image as a lower layer still get setuid binaries, device nodes and
// executables; only direct access under the mount directory loses them.
const mountAttrs = unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC

// Mount mounts the EROFS image at target, an existing directory, read-only. It first tries a
// file-backed mount (Linux 6.12+ with CONFIG_EROFS_FS_BACKED_BY_FILE). The kernel refuses that,
// with ENOTBLK, when it lacks the feature, when the image is on a filesystem without read_folio
// (tmpfs), or when the image is on a stacked filesystem (overlayfs, FUSE with passthrough; see
// the package doc). Mount then attaches the image to a read-only loop device with autoclear and
// mounts that; the device goes away with the mount. It returns which way it took.
//
// An image with extra devices (one from BuildSplit) needs them in opts.Devices, one file per
// device the image records, each at least as large as the image says. A file-backed mount passes
// them as files; the loop fallback puts each on a loop device of its own, because the kernel
// refuses to mix an image file with device block devices and the reverse (EINVAL). Mount checks
// the count and sizes first, since the kernel's EINVAL for a wrong count says nothing, and an
// image mounted without its devices fails only later, with EIO on every read of file data: either
// wraps errdefs.ErrInvalid. (An image with no Devices is accepted when it holds its devices'
// blocks itself, as a flat image does, or when they are empty.)
//
// The mount is made with the new mount API (fsopen/fsconfig/fsmount/move_mount) rather than
// mount(2): a failed fsconfig can leave the kernel's reason in the fs context, which mount(2)
// drops (errors quote it when there is one; 6.18 gives none for ENOTBLK), the mount is never
// visible at target before its flags are set, and a failure before move_mount leaves nothing
// mounted anywhere.
func Mount(image, target string, opts MountOptions) (Backing, error) {
	b, err := mount(image, target, opts)
	if err != nil {
		return Backing{}, fmt.Errorf("mount erofs image %s at %s: %w", image, target, err)
	}
	return b, nil
}

func mount(image, target string, opts MountOptions) (Backing, error) {
	abs, err := filepath.Abs(image)
	if err != nil {
		return Backing{}, err
	}
	if st, err := os.Stat(abs); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Backing{}, fmt.Errorf("image missing: %w", errdefs.ErrNotFound)
		}
		return Backing{}, err
	} else if !st.Mode().IsRegular() {
		return Backing{}, fmt.Errorf("image is not a regular file: %w", errdefs.ErrInvalid)
	}
	if st, err := os.Lstat(target); err != nil {
		return Backing{}, fmt.Errorf("mount point: %w", err)
	} else if !st.IsDir() {
		return Backing{}, fmt.Errorf("mount point is not a directory: %w", errdefs.ErrInvalid)
	}
	devs, err := checkDevices(abs, opts.Devices)
	if err != nil {
		return Backing{}, err
	}

	var refused error
	if !opts.ForceLoop {
		b, err := mountFile(abs, devs, target)
		if err == nil {
			return b, nil
		}
		var re *refusedError
		if !errors.As(err, &re) {
			return Backing{}, err
		}
		refused = err
	}
	b, err := mountLoop(abs, devs, target)
	switch {
	case err == nil:
		return b, nil
	case refused != nil:
		return Backing{}, fmt.Errorf("file-backed mount refused (%w), loop fallback also failed: %w", refused, err)
	default:
		return Backing{}, fmt.Errorf("loop mount: %w", err)
	}
}

// checkDevices checks the extra device files against the device table of image and returns their
// absolute paths. An image whose superblock it cannot read is left to the kernel to judge.
func checkDevices(image string, devices []string) ([]string, error) {
	var abs []string
	sizes := make([]int64, len(devices))
	for i, d := range devices {
		a, err := filepath.Abs(d)
		if err != nil {
			return nil, err
		}
		st, err := os.Stat(a)
		switch {
		case errors.Is(err, os.ErrNotExist):
			return nil, fmt.Errorf("device %s missing: %w", d, errdefs.ErrNotFound)
		case err != nil:
			return nil, fmt.Errorf("device: %w", err)
		case !st.Mode().IsRegular():
			return nil, fmt.Errorf("device %s is not a regular file: %w", d, errdefs.ErrInvalid)
		}
		abs = append(abs, a)
		sizes[i] = st.Size()
	}
	f, err := os.Open(image)
	if err != nil {
		return nil, fmt.Errorf("open image: %w", err)
	}
	defer f.Close()
	sb, err := readSuper(f)
	if err != nil {
		return abs, nil
	}
	if len(devices) == 0 {
		st, err := f.Stat()
		if err != nil {
			return nil, err
		}
		for i, d := range sb.devices {
			if d.blocks > 0 && int64(d.uniaddr+d.blocks)<<sb.blkBits > st.Size() {
				return nil, fmt.Errorf("image keeps file data in %d extra devices (device %d: %d bytes); pass them in MountOptions.Devices: %w",
					len(sb.devices), i+1, d.size(sb.blkBits), errdefs.ErrInvalid)
			}
		}
		return nil, nil
	}
	if len(devices) != len(sb.devices) {
		return nil, fmt.Errorf("image has %d extra devices, %d given: %w", len(sb.devices), len(devices), errdefs.ErrInvalid)
	}
	for i, d := range sb.devices {
		if sizes[i] < d.size(sb.blkBits) {
			return nil, fmt.Errorf("device %s is %d bytes; the image needs %d: %w", devices[i], sizes[i], d.size(sb.blkBits), errdefs.ErrInvalid)
		}
	}
	return abs, nil
}

// refusedError is the kernel refusing to make an EROFS superblock from a source: for an image
// file, the cue to fall back to a loop device.
type refusedError struct {
	errno syscall.Errno
	log   string // the kernel's messages from the fs context, if any
}

// Error says which errno and what the kernel logged.
func (e *refusedError) Error() string {
	s := unix.ErrnoName(e.errno) + ": " + e.errno.Error()
	if e.log != "" {
		s += "; kernel: " + e.log
	}
	return s
}

// Unwrap returns the errno.
func (e *refusedError) Unwrap() error { return e.errno }

// mountFile makes a file-backed mount of image at target, with the "directio" option if the
// kernel has it. Without it every block read would be cached twice: as a page of the EROFS file
// and as a page of the image (measured on 6.18: reading all of a 234 MB image left 224 MB of the
// image in the page cache; 19 MB, its metadata, with directio). It returns a *refusedError when
// the kernel will not mount the file, the cue to fall back to a loop device.
func mountFile(image string, devices []string, target string) (Backing, error) {
	dio, err := mountSource(image, devices, target, true)
	var re *refusedError
	if errors.As(err, &re) && re.errno != unix.ENOTBLK {
		// Perhaps it was directio the kernel refused (no O_DIRECT on the image's filesystem).
		// ENOTBLK is about the file itself: no need to ask again.
		dio, err = mountSource(image, devices, target, false)
	}
	if err != nil {
		return Backing{}, err
	}
	return Backing{Kind: BackingFile, DirectIO: dio}, nil
}

// mountSource mounts the EROFS filesystem in source (an image file or a block device) with the
// extra devices (files or block devices, as source is) at target, with the file-backed "directio"
// option if directio is set and the kernel knows it. It reports whether it used that option, and
// returns a *refusedError when the kernel will not create the superblock.
func mountSource(source string, devices []string, target string, directio bool) (bool, error) {
	fsfd, err := unix.Fsopen("erofs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		if errors.Is(err, unix.ENODEV) {
			return false, fmt.Errorf("kernel has no erofs filesystem (CONFIG_EROFS_FS; try modprobe erofs): %w", errdefs.ErrUnavailable)
		}
		return false, fmt.Errorf("fsopen erofs: %w", err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigSetString(fsfd, "source", source); err != nil {
		return false, fmt.Errorf("fsconfig source: %w%s", err, withLog(fsMessages(fsfd)))
	}
	for _, d := range devices {
		if err := unix.FsconfigSetString(fsfd, "device", d); err != nil {
			return false, fmt.Errorf("fsconfig device %s: %w%s", d, err, withLog(fsMessages(fsfd)))
		}
	}
	// "ro" makes the kernel open a block device read-only, which a read-only loop device requires.
	if err := unix.FsconfigSetFlag(fsfd, "ro"); err != nil {
		return false, fmt.Errorf("fsconfig ro: %w%s", err, withLog(fsMessages(fsfd)))
	}
	if directio {
		if err := unix.FsconfigSetFlag(fsfd, "directio"); err != nil {
			fsMessages(fsfd) // "Unknown parameter": an older kernel; drop the message
			directio = false
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		var errno syscall.Errno
		if !errors.As(err, &errno) {
			return false, fmt.Errorf("fsconfig create: %w", err)
		}
		return false, &refusedError{errno: errno, log: fsMessages(fsfd)}
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, mountAttrs)
	if err != nil {
		return false, fmt.Errorf("fsmount: %w%s", err, withLog(fsMessages(fsfd)))
	}
	// Closing mfd after a failed move_mount dissolves the detached mount.
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return false, fmt.Errorf("move_mount: %w", err)
	}
	return directio, nil
}

// fsMessages drains the kernel's messages ("e erofs: ...") from an fs context, joined by "; ".
func fsMessages(fsfd int) string {
	var msgs []string
	buf := make([]byte, 1024)
	for range 8 {
		n, err := unix.Read(fsfd, buf)
		if err != nil || n <= 0 {
			break
		}
		msgs = append(msgs, strings.TrimSpace(string(buf[:n])))
	}
	return strings.Join(msgs, "; ")
}

func withLog(log string) string {
	if log == "" {
		return ""
	}
	return " (kernel: " + log + ")"
}

// Unmount unmounts the EROFS filesystem at target. A loop device behind it is released by
// autoclear when its last mount goes. If the mount is busy (a process has its cwd or a file open
// under it, or an overlay uses it as a lower layer) Unmount retries for a short grace period and
// then returns an error wrapping unix.EBUSY and errdefs.ErrConflict; it never detaches lazily.
// Nothing mounted at target, or something other than EROFS, wraps errdefs.ErrNotFound.
func Unmount(target string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount erofs at %s: %w: %w", target, err, errdefs.ErrNotFound)
		}
		return fmt.Errorf("unmount erofs at %s: %w", target, err)
	}
	if uint32(st.Type) != unix.EROFS_SUPER_MAGIC_V1 {
		return fmt.Errorf("unmount erofs at %s: no erofs mounted there (filesystem magic %#x): %w", target, st.Type, errdefs.ErrNotFound)
	}
	deadline := time.Now().Add(unmountBusyGrace)
	for {
		err := unix.Unmount(target, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EINVAL):
			return fmt.Errorf("unmount erofs at %s: not a mount point: %w", target, errdefs.ErrNotFound)
		case errors.Is(err, unix.EBUSY) && time.Now().Before(deadline):
			time.Sleep(5 * time.Millisecond) // polling with a deadline: the kernel has no event for "not busy"
		case errors.Is(err, unix.EBUSY):
			return fmt.Errorf("unmount erofs at %s: %w: still in use (an open file, a cwd, or an overlay using it as a layer): %w",
				target, err, errdefs.ErrConflict)
		default:
			return fmt.Errorf("unmount erofs at %s: %w", target, err)
		}
	}
}

// unmountBusyGrace is how long Unmount retries EBUSY: long enough for the files of a process that
// just exited to be closed, short enough that a real leak is reported, not waited out.
var unmountBusyGrace = 200 * time.Millisecond

// mountLoop attaches image and each extra device to a loop device of its own and mounts them at
// target.
func mountLoop(image string, devices []string, target string) (Backing, error) {
	var loops []string
	dio := true
	for _, f := range append([]string{image}, devices...) {
		fd, dev, d, err := attachLoop(f)
		if err != nil {
			if f != image {
				err = fmt.Errorf("device %s: %w", f, err)
			}
			return Backing{}, err
		}
		// The mount holds the device open from here; when it goes, autoclear detaches the device.
		// If the mount fails (or a later attach does), this close is the last and detaches it now.
		defer unix.Close(fd)
		loops = append(loops, dev)
		dio = dio && d
	}
	if _, err := mountSource(loops[0], loops[1:], target, false); err != nil {
		return Backing{}, fmt.Errorf("%s: %w", strings.Join(loops, ", "), err)
	}
	b := Backing{Kind: BackingLoop, Device: loops[0], DirectIO: dio}
	if len(loops) > 1 {
		b.Devices = loops[1:]
	}
	return b, nil
}

// loopAttempts bounds the retries when other processes take the free loop device first.
const loopAttempts = 20

// attachLoop binds image to a free loop device, read-only, with autoclear and, where the backing
// filesystem allows it, direct I/O. It returns an open descriptor for the device, its path and
// whether it does direct I/O; the device lives until the descriptor and every later opener (the
// mount) are closed.
func attachLoop(image string) (fd int, dev string, dio bool, err error) {
	img, err := unix.Open(image, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", false, fmt.Errorf("open %s: %w", image, err)
	}
	defer unix.Close(img)
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", false, fmt.Errorf("open /dev/loop-control (is the loop module loaded?): %w", err)
	}
	defer unix.Close(ctl)
	for range loopAttempts {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return -1, "", false, fmt.Errorf("find a free loop device: %w", err)
		}
		dev = "/dev/loop" + strconv.Itoa(n)
		// O_CLOEXEC matters: a child that inherited this descriptor would keep the device
		// attached after the unmount.
		fd, err = unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, "", false, fmt.Errorf("open %s: %w", dev, err)
		}
		// Direct I/O with 4 KiB blocks (EROFS's block size): without it every block the kernel
		// reads would sit in the page cache twice, once for the image file and once for EROFS.
		cfg := unix.LoopConfig{Fd: uint32(img), Size: 4096}
		cfg.Info.Flags = unix.LO_FLAGS_READ_ONLY | unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
		copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], image)
		err = unix.IoctlLoopConfigure(fd, &cfg)
		if errors.Is(err, unix.EINVAL) { // the image's filesystem cannot do O_DIRECT
			cfg.Size = 0
			cfg.Info.Flags &^= unix.LO_FLAGS_DIRECT_IO
			err = unix.IoctlLoopConfigure(fd, &cfg)
		}
		if err == nil {
			// The kernel may turn direct I/O off by itself (a misaligned backing device).
			if info, err := unix.IoctlLoopGetStatus64(fd); err == nil {
				dio = info.Flags&unix.LO_FLAGS_DIRECT_IO != 0
			}
			return fd, dev, dio, nil
		}
		unix.Close(fd)
		if !errors.Is(err, unix.EBUSY) {
			return -1, "", false, fmt.Errorf("configure %s (LOOP_CONFIGURE needs Linux 5.8): %w", dev, err)
		}
	}
	return -1, "", false, fmt.Errorf("configure a loop device: other processes took the free device %d times in a row: %w",
		loopAttempts, errdefs.ErrExhausted)
}
