package runc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/mountinfo"
)

// mountOverlay mounts overlayfs at target: lower is bottom (base) first, as in Spec.Lower. With
// im every directory is given as an idmapped mount made with its user namespace (userns.go);
// upper and work must then be directories at the root of one mount (the sandbox's disk).
// It uses the new mount API ("lowerdir+", Linux 6.8+), which takes each layer as its own
// parameter: no escaping, no one-page limit on the option string. Older kernels get mount(2).
//
// overlayfs shows in the mount's options the strings it was given for its directories, and a
// sandbox reads them in its /proc/self/mountinfo. Measured on 6.18: a directory given as a path
// shows that path, one given by descriptor (FSCONFIG_SET_FD) its full host path, a relative one
// the string as given. So each directory is given as "." from a working directory set to it,
// on a thread of its own (see overlayOnThread): the options read lowerdir+=.,...,upperdir=.,
// workdir=., nothing of the data dir. Older kernels get /proc/self/fd/N strings instead.
func mountOverlay(target string, lower []string, upper, work string, im *idmap) error {
	err := overlayOnThread(func() error { return mountOverlayFsconfig(target, lower, upper, work, im) })
	if errors.Is(err, errNoLowerdirPlus) && im != nil {
		return fmt.Errorf("idmapped overlay: %w", err)
	}
	if errors.Is(err, errNoLowerdirPlus) {
		return mountOverlayLegacy(target, lower, upper, work)
	}
	return err
}

var errNoLowerdirPlus = errors.New("overlayfs lacks lowerdir+")

// overlayOnThread runs f on a locked OS thread with a working directory of its own
// (unshare(CLONE_FS)), which f may change. The thread is never unlocked, so Go ends it after f
// rather than reuse it with a changed directory (or, were it the main thread, parks it for
// good); this process's other threads keep theirs. The directory goes back to / first: a thread
// still ending (or parked) must not keep the sandbox's disk busy.
func overlayOnThread(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- fmt.Errorf("unshare working directory: %w", err)
			return
		}
		err := f()
		if cerr := unix.Chdir("/"); cerr != nil && err == nil {
			err = fmt.Errorf("leave the overlay's directories: %w", cerr)
		}
		errc <- err
	}()
	return <-errc
}

// mountOverlayFsconfig mounts with lowerdir+, giving each directory as "." after a chdir into
// it. Preconditions: runs under overlayOnThread.
func mountOverlayFsconfig(target string, lower []string, upper, work string, im *idmap) error {
	var ns *os.File
	if im != nil {
		// overlayfs does its own work in the upper layer (its work directory, whiteouts,
		// copy-ups) with the credentials of whoever made it; through the idmapped upper layer
		// only the namespace's ids can write, so it is made with the namespace owner's (which
		// its root is), keeping this thread's capabilities. The thread is never reused.
		if err := becomeOwner(im.owner); err != nil {
			return err
		}
		ns = im.ns
	}
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		if errors.Is(err, unix.ENOSYS) {
			return errNoLowerdirPlus
		}
		return fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fsfd)
	disk := -1 // the idmapped mount of upper's and work's filesystem
	var keep []int
	defer func() {
		for _, fd := range keep {
			unix.Close(fd)
		}
	}()
	if ns != nil {
		if filepath.Dir(upper) != filepath.Dir(work) {
			return fmt.Errorf("idmapped overlay: upper %s and work %s are not in one directory", upper, work)
		}
		if disk, err = idmappedTree(filepath.Dir(upper), ns); err != nil {
			return err
		}
		defer unix.Close(disk)
	}
	set := func(key, dir string) error {
		switch {
		case ns == nil:
			if err := unix.Chdir(dir); err != nil {
				return fmt.Errorf("overlay %s %s: %w", key, dir, err)
			}
		case key == "lowerdir+":
			fd, err := idmappedTree(dir, ns)
			if err != nil {
				return err
			}
			// Open until the overlay is made: closing a detached mount's last descriptor
			// dissolves it, and overlayfs clones its layers only at FsconfigCreate.
			keep = append(keep, fd)
			if err := unix.Fchdir(fd); err != nil {
				return fmt.Errorf("overlay %s %s: %w", key, dir, err)
			}
		default:
			fd, err := unix.Openat(disk, filepath.Base(dir), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("overlay %s %s: %w", key, dir, err)
			}
			defer unix.Close(fd)
			if err := unix.Fchdir(fd); err != nil {
				return fmt.Errorf("overlay %s %s: %w", key, dir, err)
			}
		}
		return unix.FsconfigSetString(fsfd, key, ".")
	}
	// overlayfs stacks lowerdir+ layers in the order given, the first being the topmost.
	for i := len(lower) - 1; i >= 0; i-- {
		if err := set("lowerdir+", lower[i]); err != nil {
			if errors.Is(err, unix.EINVAL) && i == len(lower)-1 {
				return errNoLowerdirPlus
			}
			return fmt.Errorf("overlay layer %s: %w%s", lower[i], err, fsMessages(fsfd))
		}
	}
	for _, kv := range [][2]string{{"upperdir", upper}, {"workdir", work}} {
		if err := set(kv[0], kv[1]); err != nil {
			return fmt.Errorf("overlay %s %s: %w%s", kv[0], kv[1], err, fsMessages(fsfd))
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return fmt.Errorf("create overlay: %w%s", err, fsMessages(fsfd))
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return fmt.Errorf("fsmount overlay: %w%s", err, fsMessages(fsfd))
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move overlay mount to %s: %w", target, err)
	}
	return nil
}

// fsMessages drains the kernel's messages about a failed fsconfig; they say which option failed.
func fsMessages(fsfd int) string {
	var msgs []string
	buf := make([]byte, 1024)
	for range 8 {
		n, err := unix.Read(fsfd, buf)
		if err != nil || n <= 0 {
			break
		}
		msgs = append(msgs, string(buf[:n]))
	}
	if len(msgs) == 0 {
		return ""
	}
	return " (" + strings.Join(msgs, "; ") + ")"
}

// mountOverlayLegacy mounts with mount(2), each directory given as /proc/self/fd/N of a
// descriptor opened here: no host path in the options (mount(2) resolves all of them at once,
// so the "." of mountOverlayFsconfig cannot work), and no limit on the paths' characters.
func mountOverlayLegacy(target string, lower []string, upper, work string) error {
	names := make([]string, 0, len(lower)+2)
	for _, d := range append(slices.Clone(lower), upper, work) {
		fd, err := unix.Open(d, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open overlay dir %s: %w", d, err)
		}
		defer unix.Close(fd)
		names = append(names, "/proc/self/fd/"+strconv.Itoa(fd))
	}
	n := len(lower)
	dirs := slices.Clone(names[:n])
	slices.Reverse(dirs) // lowerdir lists the topmost first
	opts := "lowerdir=" + strings.Join(dirs, ":") + ",upperdir=" + names[n] + ",workdir=" + names[n+1]
	if len(opts) >= unix.Getpagesize() {
		return errdefs.Invalid("Lower", "overlay options are %d bytes, over this kernel's page-size limit: use fewer layers", len(opts))
	}
	if err := unix.Mount("overlay", target, "overlay", unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount overlay on %s: %w", target, err)
	}
	return nil
}

func octal3(s string) (byte, bool) {
	if len(s) != 3 {
		return 0, false
	}
	var v int
	for _, c := range s {
		if c < '0' || c > '7' {
			return 0, false
		}
		v = v*8 + int(c-'0')
	}
	return byte(v), v < 256
}

// unmountAll unmounts everything at or below dirs, deepest first. A mount still busy after a grace
// period (a process of the sandbox still exiting) is detached lazily.
func unmountAll(ctx context.Context, dirs ...string) error {
	_, err := unmountAllUnder(ctx, dirs...)
	return err
}

// unmountAllUnder is unmountAll that also returns the loop devices it unmounted: the one reader
// of the mount table per pass, and one more that sees nothing left.
func unmountAllUnder(ctx context.Context, dirs ...string) (loops []string, err error) {
	deadline := time.Now().Add(5 * time.Second)
	for pass := 0; ; pass++ {
		ms, err := mountinfo.UnderAny(dirs...)
		if err != nil || len(ms) == 0 {
			return loops, err
		}
		if pass > 1000 {
			return loops, fmt.Errorf("unmount under %s: %d mounts remain", strings.Join(dirs, ", "), len(ms))
		}
		// dirs in the order given (a sandbox's rootfs overlay before the disk under its upper
		// dir), each deepest first.
		slices.SortStableFunc(ms, func(a, b mountinfo.Mount) int { return dirIndex(dirs, a.Point) - dirIndex(dirs, b.Point) })
		var busy bool
		for _, m := range ms {
			flags := 0
			if time.Now().After(deadline) || ctx.Err() != nil {
				flags = unix.MNT_DETACH
			}
			err := unix.Unmount(m.Point, flags|unix.UMOUNT_NOFOLLOW)
			switch {
			case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
				if strings.HasPrefix(m.Source, "/dev/loop") && !slices.Contains(loops, m.Source) {
					loops = append(loops, m.Source)
				}
			case errors.Is(err, unix.EBUSY):
				busy = true
			default:
				return loops, fmt.Errorf("unmount %s: %w", m.Point, err)
			}
		}
		if busy {
			time.Sleep(2 * time.Millisecond) // polling with a deadline: the kernel has no event for "not busy"
		}
	}
}

// dirIndex returns the index of the first of dirs that holds path.
func dirIndex(dirs []string, path string) int {
	return slices.IndexFunc(dirs, func(dir string) bool { return path == dir || strings.HasPrefix(path, dir+"/") })
}

// teardownDir unmounts everything under dir, detaches loop devices backed by its files and
// removes it. It refuses to remove a directory that still has a mount below it.
func teardownDir(ctx context.Context, dir string) error {
	return teardownDirs(ctx, dir)
}

// teardownDirs is teardownDir for several directories at once: the mount table is read once per
// unmount pass for all of them (typically twice in all), and the loop devices checked are those
// it unmounted; every loop device is looked at only when a directory holds a disk image that
// was not mounted from one (attached by other means, or a crash between attach and mount).
func teardownDirs(ctx context.Context, dirs ...string) error {
	dirs = slices.DeleteFunc(slices.Clone(dirs), func(dir string) bool {
		_, err := os.Lstat(dir)
		return errors.Is(err, os.ErrNotExist)
	})
	if len(dirs) == 0 {
		return nil
	}
	loops, err := unmountAllUnder(ctx, dirs...)
	if err != nil {
		return err
	}
	var errs []error
	for _, dir := range dirs {
		devs := loopsBackedUnder(dir, loops)
		if len(loops) == 0 {
			if _, err := os.Lstat(filepath.Join(dir, diskImage)); err == nil {
				devs = loopsBackedUnder(dir, nil)
			}
		}
		if err := detachLoops(devs); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, dir := range dirs {
		if err := os.RemoveAll(dir); err != nil {
			if mps, merr := mountinfo.Under(dir); merr != nil || len(mps) > 0 {
				return fmt.Errorf("remove %s: still mounted: %v (%v)", dir, mps, merr)
			}
			return fmt.Errorf("remove %s: %w", dir, err)
		}
	}
	return nil
}
