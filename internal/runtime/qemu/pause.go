package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime"
)

// Pause saves the VM's memory and device state to <dir>/snapshot.bin and ends its QEMU process,
// so the host gets all of the VM's memory back. The writable disk stays as it is (it is not in
// the snapshot; nothing writes it while paused). On error the VM runs on as before.
//
// Errors: errdefs.ErrNotFound for an unknown sandbox; errdefs.ErrConflict if it is already
// paused or is stopped.
func (r *Runtime) Pause(ctx context.Context, id string) (runtime.PauseStats, error) {
	start := time.Now()
	unlock := r.lock(id)
	defer unlock()
	st, err := r.readState(id)
	if err != nil {
		return runtime.PauseStats{}, err
	}
	if st.Paused {
		return runtime.PauseStats{}, errdefs.Conflict("sandbox %s is already paused", id)
	}
	if st.Off {
		return runtime.PauseStats{}, errdefs.Conflict("sandbox %s is powered off", id)
	}
	if !alive(st) {
		return runtime.PauseStats{}, errdefs.Conflict("sandbox %s is stopped", id)
	}
	before := rss(st.Pid)
	dir := r.dir(id)
	q, err := dialQMP(ctx, filepath.Join(dir, "qmp.sock"))
	if err != nil {
		return runtime.PauseStats{}, fmt.Errorf("pause %s: %w", id, err)
	}
	defer q.Close()
	undo := func(err error) (runtime.PauseStats, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if cerr := q.run(cctx, "cont", nil, nil); cerr != nil {
			err = errors.Join(err, fmt.Errorf("resume after the failed pause: %w", cerr))
		}
		os.Remove(filepath.Join(dir, snapshotFile))
		os.Remove(filepath.Join(dir, "frozen"))
		return runtime.PauseStats{}, fmt.Errorf("pause %s: %w%s", id, err, r.qemuLogTail(id))
	}
	// Marked first: if corral dies from here until the pause is recorded, Status reports the
	// stopped vCPUs and reconcile lets them run again.
	if err := os.WriteFile(filepath.Join(dir, "frozen"), nil, 0o600); err != nil {
		return undo(err)
	}
	if err := q.run(ctx, "stop", nil, nil); err != nil {
		return undo(err)
	}
	frozen := time.Since(start)
	if err := save(ctx, q, filepath.Join(dir, snapshotFile)); err != nil {
		return undo(err)
	}
	// The snapshot is complete: from here on the VM is the file.
	st.Paused = true
	if err := r.writeState(st); err != nil {
		st.Paused = false
		return undo(err)
	}
	q.run(ctx, "quit", nil, nil)
	pid := *st
	st.Pid, st.PidStart = 0, 0
	r.writeState(st)
	if err := kill(context.WithoutCancel(ctx), &pid); err != nil {
		r.log.Error("end the paused VM's QEMU", "sandbox", id, "err", err)
	}
	os.Remove(filepath.Join(dir, "frozen"))
	return runtime.PauseStats{Duration: time.Since(start), Freeze: frozen, MemoryBefore: before, MemoryReturned: before}, nil
}

func syncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// Resume starts a new QEMU process from the VM's snapshot: the guest goes on where it stopped,
// with its processes and files, and its agent reconnects to the new process's socket. The
// snapshot is removed once the VM runs.
//
// Errors: errdefs.ErrNotFound for an unknown sandbox; errdefs.ErrConflict if it is not paused.
func (r *Runtime) Resume(ctx context.Context, id string) (runtime.ResumeStats, error) {
	start := time.Now()
	unlock := r.lock(id)
	defer unlock()
	st, err := r.readState(id)
	if err != nil {
		return runtime.ResumeStats{}, err
	}
	if !st.Paused {
		if alive(st) {
			// Stopped by Freeze: let it run.
			if err := r.thaw(ctx, id); err != nil {
				return runtime.ResumeStats{}, err
			}
			return runtime.ResumeStats{Duration: time.Since(start)}, nil
		}
		return runtime.ResumeStats{}, errdefs.Conflict("sandbox %s is not paused", id)
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.BootTimeout)
	defer cancel()
	dir := r.dir(id)
	snap := filepath.Join(dir, snapshotFile)
	f, err := os.Open(snap)
	if err != nil {
		return runtime.ResumeStats{}, fmt.Errorf("resume %s: %w", id, err)
	}
	defer f.Close()
	// A QEMU still recorded here is one a crash left: of a pause that had saved the snapshot
	// but not yet ended it, or of a resume that had not finished. The snapshot is the VM.
	if err := kill(ctx, st); err != nil {
		return runtime.ResumeStats{}, fmt.Errorf("resume %s: end the earlier QEMU: %w", id, err)
	}
	os.Remove(filepath.Join(dir, "qmp.sock"))
	os.Remove(filepath.Join(dir, "ctl.sock"))
	// vm.json says paused, with the new process's pid, until the VM runs: a crash in between
	// leaves a sandbox that the next Resume restores again.
	if err := r.start(ctx, st, true); err != nil {
		return runtime.ResumeStats{}, fmt.Errorf("resume %s: %w", id, err)
	}
	fail := func(err error) (runtime.ResumeStats, error) {
		proc := *st
		st.Pid, st.PidStart = 0, 0
		r.writeState(st)
		kill(context.WithoutCancel(ctx), &proc)
		return runtime.ResumeStats{}, fmt.Errorf("resume %s: %w%s", id, err, r.qemuLogTail(id))
	}
	if err := incoming(ctx, filepath.Join(dir, "qmp.sock"), f); err != nil {
		return fail(err)
	}
	st.Paused = false
	if err := r.writeState(st); err != nil {
		return fail(err)
	}
	os.Remove(snap)
	os.Remove(filepath.Join(dir, "frozen")) // a crashed pause's
	if _, err := r.proxy(id); err != nil {
		return runtime.ResumeStats{}, err
	}
	return runtime.ResumeStats{Duration: time.Since(start)}, nil
}

// Freeze stops the VM's vCPUs (QMP stop); Thaw lets them run again. The memory stays.
func (r *Runtime) Freeze(ctx context.Context, id string) error {
	unlock := r.lock(id)
	defer unlock()
	st, err := r.readState(id)
	if err != nil {
		return err
	}
	if st.Paused || !alive(st) {
		return errdefs.Conflict("sandbox %s is not running", id)
	}
	q, err := dialQMP(ctx, filepath.Join(r.dir(id), "qmp.sock"))
	if err != nil {
		return err
	}
	defer q.Close()
	if err := os.WriteFile(filepath.Join(r.dir(id), "frozen"), nil, 0o600); err != nil {
		return err
	}
	if err := q.run(ctx, "stop", nil, nil); err != nil {
		os.Remove(filepath.Join(r.dir(id), "frozen"))
		return err
	}
	return nil
}

// Thaw lets the vCPUs of a VM stopped by Freeze run again.
func (r *Runtime) Thaw(ctx context.Context, id string) error {
	unlock := r.lock(id)
	defer unlock()
	return r.thaw(ctx, id)
}

func (r *Runtime) thaw(ctx context.Context, id string) error {
	q, err := dialQMP(ctx, filepath.Join(r.dir(id), "qmp.sock"))
	if err != nil {
		return err
	}
	defer q.Close()
	if err := q.run(ctx, "cont", nil, nil); err != nil {
		return err
	}
	os.Remove(filepath.Join(r.dir(id), "frozen"))
	return nil
}

// incoming loads the snapshot in f into a QEMU started with "-incoming defer" (QMP at qmpPath)
// and lets the VM run.
func incoming(ctx context.Context, qmpPath string, f *os.File) error {
	q, err := dialQMP(ctx, qmpPath)
	if err != nil {
		return err
	}
	defer q.Close()
	if err := q.sendFile(ctx, "snap", f); err != nil {
		return err
	}
	if err := q.run(ctx, "migrate-incoming", map[string]string{"uri": "fd:snap"}, nil); err != nil {
		return err
	}
	for {
		s, err := q.status(ctx)
		if err != nil {
			return err
		}
		if s != "inmigrate" {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	// The source was stopped when it was saved, so the copy starts stopped too.
	return q.run(ctx, "cont", nil, nil)
}

// save migrates the stopped VM (QMP q) into the file at path. On error the VM is stopped
// still: the caller lets it run again or ends it.
func save(ctx context.Context, q *qmp, path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	err = q.sendFile(ctx, "snap", f)
	f.Close()
	if err != nil {
		return err
	}
	if err := q.run(ctx, "migrate", map[string]string{"uri": "fd:snap"}, nil); err != nil {
		return err
	}
	if _, err := q.waitMigration(ctx); err != nil {
		return err
	}
	return syncFile(path)
}
