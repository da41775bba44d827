package runc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// A slot is a sandbox directory made ahead of the sandbox: an ext4 image, loop-mounted at disk/,
// with disk/upper and disk/work made. Create claims one by renaming it to <StateDir>/<id>; the
// mount follows the rename. Slots of the default size are pooled; others are made on demand.
//
// The image's blocks are allocated on the host when it is made (fallocate: unwritten extents,
// no data written), unless Config.SparseDisks. A sparse image promises blocks the host may not
// have when the sandbox writes: the loop device's write into a hole then fails after ext4 inside
// has acknowledged it, and the data is lost ("potential data loss"). Allocated up front, every
// block the sandbox's ext4 hands out is already the host's to give: a sandbox that fills its disk
// gets ENOSPC from write(2) inside, and a host whose filesystem fills takes nothing from it
// (ext4 and XFS keep reserved blocks for converting unwritten extents).

const (
	diskImage = "disk.img"
	diskMount = "disk"
)

// makeSlot makes a slot of size bytes under the pool directory and returns its path.
// On error nothing is left behind.
func (r *Runtime) makeSlot(ctx context.Context, size int64) (_ string, err error) {
	var b [8]byte
	rand.Read(b[:])
	dir := filepath.Join(r.poolDir, hex.EncodeToString(b[:]))
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("create disk slot: %w", err)
	}
	defer func() {
		if err != nil {
			if terr := teardownDir(context.WithoutCancel(ctx), dir); terr != nil {
				r.log.Warn("remove failed disk slot", "dir", dir, "err", terr)
			}
		}
	}()
	img := filepath.Join(dir, diskImage)
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("create disk image: %w", err)
	}
	defer f.Close()
	if r.cfg.SparseDisks {
		err = f.Truncate(size)
	} else {
		err = unix.Fallocate(int(f.Fd()), 0, 0, size)
	}
	if errors.Is(err, unix.ENOSPC) {
		return "", fmt.Errorf("allocate a %d-byte disk image: the host filesystem of %s is full: %w", size, r.cfg.StateDir, errdefs.ErrNodeFull)
	}
	if err != nil {
		return "", fmt.Errorf("size disk image: %w", err)
	}
	if err := r.formats.write(ctx, f, size); err != nil {
		return "", err
	}
	mnt := filepath.Join(dir, diskMount)
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return "", fmt.Errorf("create disk mountpoint: %w", err)
	}
	if err := mountLoop(f, mnt); err != nil {
		return "", err
	}
	for _, d := range []string{"upper", "work"} {
		// The upper dir's mode and owner become those of the container's /.
		p := filepath.Join(mnt, d)
		if err := os.Mkdir(p, 0o755); err != nil {
			return "", fmt.Errorf("create %s: %w", p, err)
		}
		if err := os.Chmod(p, 0o755); err != nil {
			return "", fmt.Errorf("chmod %s: %w", p, err)
		}
	}
	return dir, nil
}

// mountLoop attaches img to a free loop device with autoclear and mounts it as ext4 at mnt.
// Autoclear detaches the device when its last user goes: the mount, or, if the caller dies
// before mounting, the caller's descriptor. So a loop device never outlives its mount.
func mountLoop(img *os.File, mnt string) error {
	loop, err := attachLoop(img)
	if err != nil {
		return err
	}
	defer loop.Close()
	err = unix.Mount(loop.Name(), mnt, "ext4", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOATIME, "noinit_itable")
	if err != nil {
		return fmt.Errorf("mount %s on %s: %w", loop.Name(), mnt, err)
	}
	return nil
}

func attachLoop(img *os.File) (*os.File, error) { return attachLoopMode(img, false) }

// attachLoopMode attaches img to a free loop device, read-only when readOnly (img is then opened
// read-only too).
func attachLoopMode(img *os.File, readOnly bool) (*os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open loop control: %w", err)
	}
	defer ctl.Close()
	// Another process may take the free device between GET_FREE and CONFIGURE: retry.
	for range 20 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("find free loop device: %w", err)
		}
		name := "/dev/loop" + strconv.Itoa(n)
		loop, err := os.OpenFile(name, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", name, err)
		}
		// Direct I/O with 4 KiB blocks: the backing file's page cache would be a second copy of
		// everything the sandbox writes, charged to no sandbox (measured: 200 MiB written grew the
		// host's page cache by 400 MiB without it, 200 MiB with it, all charged to the sandbox).
		cfg := unix.LoopConfig{Fd: uint32(img.Fd()), Size: 4096}
		ro := uint32(0)
		if readOnly {
			ro = unix.LO_FLAGS_READ_ONLY
		}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO | ro
		copy(cfg.Info.File_name[:], img.Name())
		err = unix.IoctlLoopConfigure(int(loop.Fd()), &cfg)
		if errors.Is(err, unix.EINVAL) { // no O_DIRECT on the backing filesystem
			cfg.Size, cfg.Info.Flags = 0, unix.LO_FLAGS_AUTOCLEAR|ro
			err = unix.IoctlLoopConfigure(int(loop.Fd()), &cfg)
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY) {
			err = setLoopLegacy(loop, img) // LOOP_CONFIGURE is Linux 5.8+
		}
		if err == nil {
			return loop, nil
		}
		loop.Close()
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("configure %s: %w", name, err)
		}
	}
	return nil, errors.New("configure loop device: every free device was taken by someone else; retry")
}

func setLoopLegacy(loop, img *os.File) error {
	if err := unix.IoctlSetInt(int(loop.Fd()), unix.LOOP_SET_FD, int(img.Fd())); err != nil {
		return err
	}
	info := unix.LoopInfo64{Flags: unix.LO_FLAGS_AUTOCLEAR}
	copy(info.File_name[:], img.Name())
	if err := unix.IoctlLoopSetStatus64(int(loop.Fd()), &info); err != nil {
		unix.IoctlSetInt(int(loop.Fd()), unix.LOOP_CLR_FD, 0)
		return err
	}
	return nil
}

// loopsBackedUnder returns the loop devices whose backing file lies under dir, looking at only
// the devices among (/dev/loopN paths) when that is not nil, else at every loop device.
func loopsBackedUnder(dir string, among []string) []string {
	var paths []string
	if among == nil {
		paths, _ = filepath.Glob("/sys/block/loop*/loop/backing_file")
	}
	for _, dev := range among {
		paths = append(paths, filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	}
	var devs []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		file := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		if strings.HasPrefix(file, dir+"/") {
			devs = append(devs, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(p))))
		}
	}
	return devs
}

// detachLoops detaches the loop devices devs (found by loopsBackedUnder). With autoclear they
// are normally gone once their mount is; this handles devices attached by other means.
func detachLoops(devs []string) error {
	var errs []error
	for _, dev := range devs {
		f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // gone already
		}
		err = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.ENXIO) {
			errs = append(errs, fmt.Errorf("detach %s: %w", dev, err))
		}
	}
	return errors.Join(errs...)
}

// DiskUse is what a runtime's writable disks hold on the host's filesystem.
type DiskUse struct {
	// Pooled is the size of the disks made ahead for sandboxes not created yet (the pool).
	Pooled int64
	// Allocated is the bytes the sandboxes' and the pool's disk images take on the filesystem
	// (their allocated blocks, at most each image's size).
	Allocated int64
}

// DiskUse reports the writable disks of every sandbox directory and pool slot under StateDir.
// A sandbox's disk is read once (diskscan): its blocks are allocated in full before its
// directory takes the sandbox's name, and a sparse one's allocation is read again once its
// figures are sparseRestat old; the pool's slots, which change while they are made, are read
// on every call.
func (r *Runtime) DiskUse() DiskUse {
	keep := time.Duration(-1)
	if r.cfg.SparseDisks {
		keep = sparseRestat
	}
	sbs := r.disks.Scan(r.cfg.StateDir, []string{diskImage}, keep)
	pool := r.disks.Scan(r.poolDir, []string{diskImage}, 0)
	return DiskUse{Pooled: pool.Size, Allocated: sbs.Allocated + pool.Allocated}
}

// sparseRestat is how long DiskUse reuses a sparse disk's allocated bytes. A figure this old
// undercounts what the sandbox wrote since, which the data dir's free space (read on every
// admission) already lacks: the node's promise then has less room, never more.
const sparseRestat = time.Second

// refillQuiet is how long after the last Create ended a pool's refill waits while the pool
// holds at least half its entries: a client's first command follows its create within it, and
// then does not share its CPU with a mkfs or a user namespace helper's start.
const refillQuiet = 30 * time.Millisecond

// refillWait says whether a pool's refill should wait, given how many entries it holds of its
// lowWater: while at least lowWater are ready, it waits until no Create is in flight (the last
// one to end kicks it: wait is false, kicked true) and refillQuiet has passed since the last
// ended (wait the returned duration). Below lowWater it refills at once, as a create that finds
// the pool empty pays for its entry itself.
func (r *Runtime) refillWait(ready, lowWater int) (wait time.Duration, kicked bool) {
	if ready < lowWater {
		return 0, false
	}
	if r.creating.Load() > 0 {
		return 0, true
	}
	return refillQuiet - time.Since(time.Unix(0, r.createdAt.Load())), false
}

// sleepCtx waits d or until ctx ends, and reports whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// refillPool keeps r.ready full. It runs until ctx ends; Close waits for it.
//
// A slot costs a mkfs and its fallocate (5-50 ms of CPU and some I/O with its sync), which
// refillWait keeps off the CPU of creates and of the commands that follow them while the pool
// holds at least half its slots.
func (r *Runtime) refillPool(ctx context.Context) {
	defer r.wg.Done()
	r.refillLoop(ctx, r.refill, func() (int, int) { return len(r.ready), cap(r.ready) }, "refill disk pool", func() error {
		start := time.Now()
		slot, err := r.makeSlot(ctx, r.cfg.DefaultDiskBytes)
		if err != nil {
			return err
		}
		r.log.Debug("disk pool slot ready", "dir", slot, "took", time.Since(start))
		r.ready <- slot // only this goroutine sends, and len < cap: never blocks
		return nil
	})
}

// errRoundDone ends a refill round (refillLoop) until the next kick.
var errRoundDone = errors.New("refill round done")

// refillLoop runs a pool's refill until ctx ends: at each kick, while the pool (size: its
// entries and capacity) is short and refillWait lets it, fill adds an entry. fill's errors are
// logged under what and retried with a backoff (100 ms doubling to 30 s); errRoundDone waits
// for the next kick instead.
func (r *Runtime) refillLoop(ctx context.Context, kick <-chan struct{}, size func() (n, capacity int), what string, fill func() error) {
	backoff := 100 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
		}
		for ctx.Err() == nil {
			n, capacity := size()
			if n >= capacity {
				break
			}
			if wait, kicked := r.refillWait(n, (capacity+1)/2); kicked {
				break // the Create that ends last kicks the refill again
			} else if wait > 0 {
				if !sleepCtx(ctx, wait) {
					return
				}
				continue
			}
			err := fill()
			if errors.Is(err, errRoundDone) {
				break
			}
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				r.log.Warn(what, "err", err, "retry_in", backoff)
				if !sleepCtx(ctx, backoff) {
					return
				}
				backoff = min(2*backoff, 30*time.Second)
				continue
			}
			backoff = 100 * time.Millisecond
		}
	}
}

func (r *Runtime) kickRefill() {
	select {
	case r.refill <- struct{}{}:
	default:
	}
}

// takeSlot returns a slot of size bytes: from the pool when the size is the default and one is
// ready, else a fresh one.
func (r *Runtime) takeSlot(ctx context.Context, size int64) (slot string, pooled bool, err error) {
	if size == r.cfg.DefaultDiskBytes && cap(r.ready) > 0 {
		select {
		case slot := <-r.ready:
			r.kickRefill()
			return slot, true, nil
		default:
			r.kickRefill()
		}
	}
	slot, err = r.makeSlot(ctx, size)
	return slot, false, err
}

// clearPool destroys every slot in the pool directory: the ready ones and any left by a crash.
// Call it only when the refill goroutine is not running.
func (r *Runtime) clearPool(ctx context.Context) error {
	for len(r.ready) > 0 {
		<-r.ready
	}
	ents, err := os.ReadDir(r.poolDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("read disk pool: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if err := teardownDir(ctx, filepath.Join(r.poolDir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
