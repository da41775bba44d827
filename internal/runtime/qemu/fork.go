package qemu

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime"
	"github.com/corral-dev/corral/internal/vmguest"
)

// Fork. A fork takes one image of a running VM (Fork) and starts any number of new VMs from it
// (Create with Spec.Fork), then drops it (DropFork).
//
// The image is the VM's memory and device state (snapshot.bin, saved as Pause saves it: QMP
// stop, then a migration into a descriptor) and a copy of its writable disk, both taken while
// its vCPUs stand still, so the disk holds what the memory's page cache expects. QEMU flushed
// the disk when the migration inactivated it; "cont" activates it again and lets the source
// run on: it stops for the save and one sparse copy of its disk (a reflink where the host
// filesystem has them). A disk-only image (ForkOptions.DiskOnly) is the disk copy alone: the
// guest is asked to sync (syncGuest), then the disk is copied while the vCPUs are stopped, so
// it holds what the guest had written by then (what it wrote during the sync is there as after
// a power cut: ext4's journal recovers it).
//
// Each Create from a memory image copies the disk again into the new VM's directory, starts a
// QEMU of the same command line as the source's (the same kernel, initramfs, memory, vCPUs and
// devices, which a migration needs; only the name and the VM's own files differ: its disk copy,
// sockets, console, uid, cgroup and tap) with "-incoming defer", loads the snapshot (restores
// read it concurrently; nothing writes it) and lets it run: its processes go on from where the
// source's were. The guest still holds the source's address, hostname, resolver, clock and
// entropy, so once its agent answers it is given its own (agentrpc.ForkIdentity, which
// vmguest.ApplyForkIdentity applies). Memory is not shared between copies: each QEMU reads the
// snapshot into its own. A Create from a disk-only image boots a new VM on the copy.
//
// Images live in <StateDir>/.forks/<random>; New removes any a crash left there.

const forksDir = ".forks"

// forkFiles is the qemu backend's part of a ForkImage (runtime.ForkImage.Backend).
type forkFiles struct {
	dir      string   // <StateDir>/.forks/<random>
	disk     string   // dir/upper.img
	snapshot string   // dir/snapshot.bin; "" for a disk-only image
	source   *vmState // the source's state at the fork: its command line and files
}

// filesOf returns img's files, or nil when another backend took it.
func filesOf(img *runtime.ForkImage) *forkFiles {
	if img == nil {
		return nil
	}
	f, _ := img.Backend.(*forkFiles)
	return f
}

// Fork takes an image of the running microvm id for Create (Spec.Fork); see the comment above.
// The caller must DropFork it once done. On error the source runs on as before.
//
// Errors: errdefs.ErrNotFound for an unknown sandbox; errdefs.ErrConflict if it is not running
// (paused, frozen, powered off or stopped), is a vm sandbox, or has volumes.
func (r *Runtime) Fork(ctx context.Context, id string, opts runtime.ForkOptions) (_ *runtime.ForkImage, err error) {
	start := time.Now()
	unlock := r.lock(id)
	defer unlock()
	st, err := r.readState(id)
	if err != nil {
		return nil, err
	}
	switch {
	case st.Machine == MachineVM:
		return nil, errdefs.Conflict("sandbox %s is a vm sandbox: vm sandboxes cannot be forked", id)
	case st.Paused:
		return nil, errdefs.Conflict("sandbox %s is paused: only a running sandbox can be forked", id)
	case st.Off || !alive(st):
		return nil, errdefs.Conflict("sandbox %s is stopped: only a running sandbox can be forked", id)
	case r.frozen(id):
		return nil, errdefs.Conflict("sandbox %s is frozen: only a running sandbox can be forked", id)
	}
	for _, f := range st.Files {
		if strings.HasPrefix(f.Role, "volume") {
			return nil, errdefs.Conflict("sandbox %s has volumes, which a fork does not copy (a read-write volume has one writer): fork a sandbox without volumes", id)
		}
	}
	dir := r.dir(id)
	ff := &forkFiles{source: st}
	img := &runtime.ForkImage{Source: id, Memory: !opts.DiskOnly, Backend: ff}
	var b [8]byte
	rand.Read(b[:])
	ff.dir = filepath.Join(r.cfg.StateDir, forksDir, hex.EncodeToString(b[:]))
	if err := os.MkdirAll(ff.dir, 0o700); err != nil {
		return nil, fmt.Errorf("fork sandbox %s: %w", id, err)
	}
	defer func() {
		if err != nil {
			r.DropFork(img)
		}
	}()
	ff.disk = filepath.Join(ff.dir, "upper.img")
	upper := filepath.Join(dir, "upper.img")
	if fi, err := os.Stat(upper); err == nil {
		img.DiskBytes = fi.Size()
	}
	if opts.DiskOnly {
		r.syncGuest(ctx, id)
	}
	q, err := dialQMP(ctx, filepath.Join(dir, "qmp.sock"))
	if err != nil {
		return nil, fmt.Errorf("fork sandbox %s: %w", id, err)
	}
	defer q.Close()
	// Marked first, as for Pause: if corral dies while the vCPUs stand, reconcile lets them run.
	if err := os.WriteFile(filepath.Join(dir, "frozen"), nil, 0o600); err != nil {
		return nil, fmt.Errorf("fork sandbox %s: %w", id, err)
	}
	takeErr := q.run(ctx, "stop", nil, nil)
	if takeErr == nil && img.Memory {
		ff.snapshot = filepath.Join(ff.dir, snapshotFile)
		takeErr = save(ctx, q, ff.snapshot)
	}
	if takeErr == nil {
		takeErr = copySparse(ctx, upper, ff.disk)
	}
	// From here the source runs again whatever happened: cont activates the disks the migration
	// inactivated and lets the vCPUs run.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if cerr := q.run(cctx, "cont", nil, nil); cerr != nil {
		r.log.Error("let a forked VM run again", "sandbox", id, "err", cerr)
		return nil, errors.Join(fmt.Errorf("fork sandbox %s: let it run again: %w%s", id, cerr, r.qemuLogTail(id)), takeErr)
	}
	os.Remove(filepath.Join(dir, "frozen"))
	img.Stopped = time.Since(start)
	if takeErr != nil {
		return nil, fmt.Errorf("fork sandbox %s: %w%s", id, takeErr, r.qemuLogTail(id))
	}
	r.log.Debug("fork image taken", "sandbox", id, "memory", img.Memory, "stopped", img.Stopped)
	return img, nil
}

// syncGuest has the guest write what its page cache holds to its disks (sync(1) through the
// agent) before a disk-only image is taken, which has no memory to keep it: the copies then
// boot on everything written before the fork. Best effort: an image without sync, or a guest
// that takes longer than 10 s, leaves the disk as after a power cut (ext4's journal recovers it).
func (r *Runtime) syncGuest(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := agentrpc.NewClient(filepath.Join(r.dir(id), agentSocket)).Exec(ctx, agentrpc.ExecRequest{Argv: []string{"sync"}, Timeout: 10 * time.Second})
	if err != nil {
		r.log.Warn("sync a microvm's guest before a disk-only fork", "sandbox", id, "err", err)
		return
	}
	defer s.Close()
	for {
		ev, err := s.Next()
		if err != nil || ev.Exit != nil {
			if ev.Exit != nil && ev.Exit.Error != "" {
				r.log.Warn("sync a microvm's guest before a disk-only fork", "sandbox", id, "err", ev.Exit.Error)
			}
			return
		}
	}
}

// DropFork removes what Fork took. VMs created from it are not affected.
func (r *Runtime) DropFork(img *runtime.ForkImage) {
	ff := filesOf(img)
	if ff == nil {
		return
	}
	if err := os.RemoveAll(ff.dir); err != nil {
		r.log.Warn("remove fork image", "dir", ff.dir, "err", err)
	}
	os.Remove(filepath.Dir(ff.dir)) // the last one: .forks goes when nothing is left
}

// removeForkLeftovers removes the fork images a crash left behind (none is in use at New).
func (r *Runtime) removeForkLeftovers() {
	os.RemoveAll(filepath.Join(r.cfg.StateDir, forksDir))
}

// forkDisk copies img's disk to path, sparse, and allocates its blocks unless SparseDisks (a
// disk's blocks are the host's to give when it is made, as makeDisk does).
func (r *Runtime) forkDisk(ctx context.Context, img *runtime.ForkImage, path string) error {
	ff := filesOf(img)
	if err := copySparse(ctx, ff.disk, path); err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return fmt.Errorf("%w: %w", err, errdefs.ErrNodeFull)
		}
		return err
	}
	if r.cfg.SparseDisks {
		return nil
	}
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, img.DiskBytes); err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return fmt.Errorf("allocate a %d-byte disk: the host filesystem of %s is full: %w", img.DiskBytes, r.cfg.StateDir, errdefs.ErrNodeFull)
		}
		return fmt.Errorf("disk: %w", err)
	}
	return nil
}

// forkBootFiles returns the kernel and initramfs of img's source: a copy restored from its
// memory starts the very command line the source runs.
func forkBootFiles(img *runtime.ForkImage) (kernel, initrd string, err error) {
	for _, f := range filesOf(img).source.Files {
		switch f.Role {
		case "kernel":
			kernel = f.Path
		case "initrd":
			initrd = f.Path
		}
	}
	if kernel == "" || initrd == "" {
		return "", "", fmt.Errorf("the fork's source %s has no kernel or initramfs recorded", img.Source)
	}
	return kernel, initrd, nil
}

// sameShape reports whether two VMs' command lines are the same but for their names: what a
// migration from one into the other needs (memory, vCPUs, devices, in the same order).
func sameShape(a, b []string) bool {
	unname := func(args []string) []string {
		args = slices.Clone(args)
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-name" {
				args[i+1] = ""
			}
		}
		return args
	}
	return slices.Equal(unname(a), unname(b))
}

// restoreFork starts st's VM from the memory image img (its command line already checked
// against the source's) and, once its agent answers, gives its guest its own identity (c's
// hostname, network and resolver).
func (r *Runtime) restoreFork(ctx context.Context, st *vmState, img *runtime.ForkImage, c *vmguest.Config) error {
	f, err := os.Open(filesOf(img).snapshot)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := r.start(ctx, st, true); err != nil {
		return err
	}
	if err := incoming(ctx, filepath.Join(r.dir(st.ID), "qmp.sock"), f); err != nil {
		return fmt.Errorf("restore the fork's memory: %w%s", err, r.qemuLogTail(st.ID))
	}
	if err := r.recordAccel(ctx, st); err != nil {
		return fmt.Errorf("%w%s", err, r.qemuLogTail(st.ID))
	}
	if err := r.waitAgent(ctx, st, r.cfg.BootTimeout); err != nil {
		return err
	}
	id := agentrpc.ForkIdentity{Hostname: c.Hostname, ResolvConf: c.ResolvConf, Now: time.Now().UnixNano(), Seed: make([]byte, 64)}
	rand.Read(id.Seed)
	if c.Net != nil {
		id.MAC, id.Address, id.Gateway = c.Net.MAC, c.Net.Address, c.Net.Gateway
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := agentrpc.NewClient(filepath.Join(r.dir(st.ID), agentSocket)).SetForkIdentity(actx, id); err != nil {
		return fmt.Errorf("give the copy its own address and hostname: %w", err)
	}
	return nil
}

// copySparse copies the file src to dst keeping its holes (a reflink where the filesystem
// offers one).
func copySparse(ctx context.Context, src, dst string) error {
	cmd := exec.CommandContext(ctx, "cp", "--sparse=always", "--reflink=auto", src, dst)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(dst)
		msg := strings.TrimSpace(string(out))
		if strings.Contains(msg, "No space left") {
			return fmt.Errorf("copy disk image: %s: %w", msg, unix.ENOSPC)
		}
		return fmt.Errorf("copy disk image: %w: %s", err, msg)
	}
	return nil
}
