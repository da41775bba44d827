package runc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime"
)

// Fork. A fork takes one image of a running sandbox (Fork) and starts any number of new
// sandboxes from it (Create with Spec.Fork), then drops it (DropFork).
//
// The image is the sandbox's disk (its ext4 image: the writable layer, agent log included) and,
// on gVisor, a checkpoint of its processes and memory. Both are taken while the sandbox is
// stopped, so they agree: on gVisor it is checkpointed exactly as Pause does (pauseGVisor), its
// checkpoint image files hard-linked aside, its disk synced and copied, and it is restored
// again as Resume does (resumeGVisor); on runc (disk only) it is frozen with the cgroup freezer
// while its disk is synced and copied. The source stops for the checkpoint, one sparse copy of
// its disk and, on gVisor, a restore.
//
// Each Create from the image copies that disk again (sparse; a reflink where the host
// filesystem has them) into the new sandbox's slot, so copies share nothing afterwards, and on
// gVisor restores the checkpoint into the new sandbox (runsc restore with the new bundle): its
// processes go on from where the source's were. Restores read the image concurrently; runsc
// does not change it. Memory is not shared between copies: each sentry reads the pages into
// its own memory file.
//
// Images live in <StateDir>/.forks/<random>; New removes any a crash left there.

const forksDir = ".forks"

// forkFiles is runc's part of a ForkImage (runtime.ForkImage.Backend): where the image is.
type forkFiles struct {
	dir        string // <StateDir>/.forks/<random>
	disk       string // dir/disk.img
	checkpoint string // dir/checkpoint: the gVisor checkpoint image; "" without Memory
	agentBin   string // the host copy of the agent the checkpoint maps (gVisor)
	network    bool   // the source joined a network namespace (gVisor's --network=sandbox)
}

// filesOf returns img's files, or nil when another backend took it.
func filesOf(img *runtime.ForkImage) *forkFiles {
	f, _ := img.Backend.(*forkFiles)
	return f
}

// Fork takes an image of the running sandbox id for Create (Spec.Fork); see the comment above.
// The caller must DropFork it once done. A runc sandbox's processes cannot be taken (CRIU
// cannot checkpoint one as Corral builds it: docs/ARCHITECTURE.md, Fork): Fork refuses it unless
// opts.DiskOnly.
//
// Errors: errdefs.ErrNotFound for an unknown sandbox; errdefs.ErrConflict if it is not
// running (paused or stopped), or is runc and opts.DiskOnly is false.
func (r *Runtime) Fork(ctx context.Context, id string, opts runtime.ForkOptions) (_ *runtime.ForkImage, err error) {
	start := time.Now()
	st, unlock, err := r.lockedStatus(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if st.State != runtime.StateRunning {
		return nil, errdefs.Conflict("sandbox %s is %s: only a running sandbox can be forked", id, st.State)
	}
	gvisor := r.engineOf(id) == EngineGVisor
	if !gvisor && !opts.DiskOnly {
		return nil, errdefs.Conflict("sandbox %s runs on runc, whose running processes Corral cannot checkpoint (CRIU cannot take a runc sandbox as Corral builds it): fork it with disk_only (its writable layer only), or create it on gVisor (runtime gvisor) to fork its processes too", id)
	}
	dir := r.dir(id)
	ff := &forkFiles{}
	img := &runtime.ForkImage{Source: id, Memory: gvisor && !opts.DiskOnly, Backend: ff}
	var b [8]byte
	rand.Read(b[:])
	ff.dir = filepath.Join(r.cfg.StateDir, forksDir, hex.EncodeToString(b[:]))
	if err := os.MkdirAll(ff.dir, 0o700); err != nil {
		return nil, fmt.Errorf("fork sandbox %s: %w", id, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(ff.dir)
		}
	}()
	ff.disk = filepath.Join(ff.dir, diskImage)
	if st, err := os.Stat(filepath.Join(dir, diskImage)); err == nil {
		img.DiskBytes = st.Size()
	}

	if !gvisor {
		r.stopPrefetch(id)
		if err := r.cg.Freeze(ctx, id, freezeTimeout); err != nil {
			r.cg.Thaw(id)
			return nil, fmt.Errorf("fork sandbox %s: %w", id, err)
		}
		err := r.copyDisk(ctx, id, ff.disk)
		if terr := r.cg.Thaw(id); terr != nil {
			err = errors.Join(err, fmt.Errorf("thaw: %w", terr))
		}
		img.Stopped = time.Since(start)
		if err != nil {
			return nil, fmt.Errorf("fork sandbox %s: %w", id, err)
		}
		return img, nil
	}

	if ff.agentBin, err = gvisorAgentBin(dir); err != nil {
		return nil, fmt.Errorf("fork sandbox %s: %w", id, err)
	}
	ff.network = gvisorNetwork(dir) == "sandbox"
	if _, err := r.pauseGVisor(ctx, id, st); err != nil {
		return nil, fmt.Errorf("fork sandbox %s: %w", id, err)
	}
	// From here the source is checkpointed: whatever happens, it is restored before Fork returns.
	var takeErr error
	if img.Memory {
		ff.checkpoint = filepath.Join(ff.dir, checkpointDir)
		takeErr = linkTree(filepath.Join(dir, checkpointDir), ff.checkpoint)
	}
	if takeErr == nil {
		takeErr = r.copyDisk(ctx, id, ff.disk)
	}
	var restoreErr error
	if opts.BeforeRestore != nil {
		restoreErr = opts.BeforeRestore()
	}
	if restoreErr == nil {
		_, restoreErr = r.resumeGVisor(context.WithoutCancel(ctx), id)
	}
	img.Stopped = time.Since(start)
	if restoreErr != nil {
		// The source lies checkpointed (its image kept): a Resume may bring it back.
		r.log.Error("restore a forked sandbox", "id", id, "err", restoreErr)
		return nil, errors.Join(fmt.Errorf("fork sandbox %s: restore it after its checkpoint: %w", id, restoreErr), takeErr)
	}
	if takeErr != nil {
		return nil, fmt.Errorf("fork sandbox %s: %w", id, takeErr)
	}
	r.log.Debug("fork image taken", "id", id, "memory", img.Memory, "stopped", img.Stopped)
	return img, nil
}

// DropFork removes what Fork took. Sandboxes created from it are not affected.
func (r *Runtime) DropFork(img *runtime.ForkImage) {
	if img == nil || filesOf(img) == nil {
		return
	}
	ff := filesOf(img)
	if err := os.RemoveAll(ff.dir); err != nil {
		r.log.Warn("remove fork image", "dir", ff.dir, "err", err)
	}
	os.Remove(filepath.Dir(ff.dir)) // the last one: StateDir empty when nothing is left
}

// copyDisk syncs sandbox id's disk and copies its image to dst, sparse. Preconditions: id's
// lock is held; nothing in the sandbox runs (frozen or checkpointed).
func (r *Runtime) copyDisk(ctx context.Context, id, dst string) error {
	if fd, err := unix.Open(filepath.Join(r.dir(id), diskMount), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
		err = unix.Syncfs(fd)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("sync disk: %w", err)
		}
	}
	return copySparse(ctx, filepath.Join(r.dir(id), diskImage), dst)
}

// copySparse copies the file src to dst keeping its holes (a reflink where the filesystem
// offers one).
func copySparse(ctx context.Context, src, dst string) error {
	cmd := exec.CommandContext(ctx, "cp", "--sparse=always", "--reflink=auto", src, dst)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(dst)
		return fmt.Errorf("copy disk image: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// linkTree hard-links the regular files of the directory src into a new directory dst.
func linkTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.Mkdir(to, 0o700)
		case d.Type().IsRegular():
			if err := os.Link(p, to); err != nil {
				return fmt.Errorf("keep checkpoint: %w", err)
			}
			return nil
		default:
			return fmt.Errorf("keep checkpoint: %s is not a regular file", p)
		}
	})
}

// forkSlot makes a slot for a sandbox created from img: a copy of its disk, mounted.
func (r *Runtime) forkSlot(ctx context.Context, img *runtime.ForkImage) (_ string, err error) {
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
	p := filepath.Join(dir, diskImage)
	if err := copySparse(ctx, filesOf(img).disk, p); err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return "", fmt.Errorf("%w: %w", err, errdefs.ErrNodeFull)
		}
		return "", err
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return "", fmt.Errorf("open disk image: %w", err)
	}
	defer f.Close()
	if !r.cfg.SparseDisks {
		// The copy has holes where the source's disk was never written; a disk's blocks are the
		// host's to give when it is made (makeSlot), so they are allocated here too.
		if err := unix.Fallocate(int(f.Fd()), 0, 0, img.DiskBytes); err != nil {
			if errors.Is(err, unix.ENOSPC) {
				return "", fmt.Errorf("allocate a %d-byte disk image: %w", img.DiskBytes, errdefs.ErrNodeFull)
			}
			return "", fmt.Errorf("allocate disk image: %w", err)
		}
	}
	mnt := filepath.Join(dir, diskMount)
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return "", fmt.Errorf("create disk mountpoint: %w", err)
	}
	if err := mountLoop(f, mnt); err != nil {
		return "", err
	}
	// Left by the source's overlay; overlayfs wants its work dir empty of its own leftovers.
	os.RemoveAll(filepath.Join(mnt, "work", "work"))
	return dir, nil
}

// removeForkLeftovers removes the fork images a crash left behind (none is in use at New).
func (r *Runtime) removeForkLeftovers() {
	os.RemoveAll(filepath.Join(r.cfg.StateDir, forksDir))
}
