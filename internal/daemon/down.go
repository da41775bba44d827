package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/edge"
	"github.com/corral-dev/corral/internal/hostreg"
	"github.com/corral-dev/corral/internal/lazy"
	"github.com/corral-dev/corral/internal/runtime/cgroups"
	"github.com/corral-dev/corral/internal/store"
)

// stopHolder asks the corral up holding the data dir's lock (if any) to stop, and waits for it
// to let go of the lock.
func stopHolder(ctx context.Context, lock *os.File, log *slog.Logger) error {
	if syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
		syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
		return nil
	}
	b, _ := os.ReadFile(lock.Name())
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return fmt.Errorf("a corral holds %s but its pid is unknown (%q): stop it first", lock.Name(), b)
	}
	log.Info("stopping the corral that serves this data dir", "pid", pid)
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stop corral pid %d: %w", pid, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("corral pid %d did not stop within 30s of SIGTERM", pid)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	return nil
}

// down ends every live sandbox of this node through the edge (the same teardown as a delete),
// then, once the caller's deferred closes released the network, disk pool and lazyd, removes the
// cgroup parent and gives back the host registry claim.
func down(ctx context.Context, cfg Config, e *edge.Edge, st *store.Store, log *slog.Logger) error {
	recs, err := st.ListSandboxes(ctx, store.SandboxFilter{Node: cfg.Node,
		States: store.LiveStates()})
	if err != nil {
		return err
	}
	var failed []string
	for _, rec := range recs {
		if _, err := e.Delete(ctx, rec.ID); err != nil {
			log.Error("remove sandbox", "sandbox", rec.ID, "err", err)
			failed = append(failed, rec.ID)
			continue
		}
		log.Info("sandbox removed", "sandbox", rec.ID)
	}
	if len(failed) > 0 {
		return fmt.Errorf("corral down: %d sandboxes could not be removed (%s): see the log, then run corral down again", len(failed), strings.Join(failed, ", "))
	}
	log.Info("every sandbox of the data dir is gone", "count", len(recs))
	return nil
}

// Down runs `corral down`: Run in down mode (which stops a running corral of the data dir and
// ends every sandbox; its deferred closes release the network, disk pool, lazyd and the
// reservation), then removes the empty cgroup parent and gives back the host registry claim.
func Down(ctx context.Context, cfg Config, log *slog.Logger) error {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg.Down = true
	if err := Run(ctx, cfg, log, nil); err != nil {
		return err
	}
	// A lazyd that crashed left its FUSE mount dead; with no sandbox left none restarts to
	// detach it.
	if err := lazy.DetachDead(filepath.Join(cfg.DataDir, "layers", "lazy"), log); err != nil {
		log.Warn("detach lazyd's dead mount", "err", err)
	}
	reg, err := hostreg.Open(cfg.Registry)
	if err != nil {
		return err
	}
	claims, err := reg.List()
	if err != nil {
		return err
	}
	for _, c := range claims {
		if c.DataDir == cfg.DataDir {
			removeCgroupParent(c.CgroupParent, log)
		}
	}
	if err := reg.Release(cfg.DataDir); err != nil {
		return fmt.Errorf("give back the host registry claim: %w", err)
	}
	log.Info("corral down: nothing of the data dir is left on the host", "data_dir", cfg.DataDir)
	return nil
}

// removeCgroupParent removes the sandboxes' cgroup parent and Corral's control cgroup beside it
// in every hierarchy. Run's exit leaves the control cgroup when lazyd, which inherits it, has not
// ended yet, so each waits (Layout.Remove) for its last processes to leave.
func removeCgroupParent(parent string, log *slog.Logger) {
	if parent == "" || parent == "/" {
		return
	}
	l, err := cgroups.Read("/")
	if err != nil {
		log.Warn("remove cgroups", "parent", parent, "err", err)
		return
	}
	for _, name := range []string{parent, cgroups.ControlName(parent)} {
		if err := l.Remove(name, cgroupBusyWait); err != nil {
			log.Warn("remove cgroup", "cgroup", name, "err", err)
		}
	}
}

// cgroupBusyWait bounds removeCgroupParent's wait for a busy cgroup.
const cgroupBusyWait = 5 * time.Second
