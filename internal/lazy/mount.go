//go:build linux

package lazy

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// served is the FUSE connection a Run serves, with its keeper when it has one.
type served struct {
	s  *Server
	fc *fuseConn

	mu   sync.Mutex
	link *keeperLink // nil: no keeper (none configured, or it could not be started)
	stop chan struct{}
}

// mount serves the blob filesystem at <Dir>/mnt: the connection a keeper holds for a previous
// lazyd of this directory (which died), else a new mount, which it hands to a new keeper when
// the configuration names one.
func (s *Server) mount() (*served, error) {
	mnt := filepath.Join(s.cfg.Dir, mntDir)
	sv := &served{s: s, stop: make(chan struct{})}
	link, dev, id, err := attachKeeperRetrying(s.cfg.Dir)
	switch {
	case err == nil && isFuseMount(mnt):
		fc, err := resumeFuse(s, mnt, dev, id)
		if err != nil {
			dev.Close()
			link.conn.Close()
			return nil, err
		}
		sv.fc, sv.link = fc, link
		fc.serve()
		sv.watchKeeper()
		return sv, nil
	case err == nil:
		// The connection lives on (something still reads through it) but its mount point was
		// detached by hand: nothing new can be mounted through it. Let it go.
		s.cfg.Log.Warn("the kept FUSE connection has no mount point any more: letting it go", "conn", id)
		dev.Close()
		link.goodbye()
	case !errors.Is(err, errdefs.ErrNotFound):
		return nil, err
	case s.resumeOnly:
		return nil, errNothingToResume
	}
	// A lazyd that died with no keeper leaves its FUSE mount behind, dead: stat of it fails
	// with ENOTCONN and mkdir with EEXIST, so it is detached before anything else.
	if err := detachStaleMount(mnt, s.cfg.Log); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return nil, err
	}
	fc, err := mountFuse(s, mnt)
	if err != nil {
		return nil, err
	}
	sv.fc = fc
	fc.serve()
	if s.cfg.KeeperCommand != nil {
		link, err := startKeeper(s.cfg.Dir, s.cfg.KeeperCommand, s.cfg.RestartCommand, fc.dev, fc.id, s.cfg.Log)
		if err != nil {
			s.cfg.Log.Error("no keeper holds the FUSE connection: if this lazyd dies, reads through it fail until their sandboxes are recreated", "err", err)
		}
		sv.link = link
		sv.watchKeeper()
	}
	return sv, nil
}

// errNothingToResume: a lazyd the keeper started found no connection to resume (another one
// took it and exited on purpose meanwhile).
var errNothingToResume = errors.New("no kept FUSE connection to resume")

// attachKeeperRetrying is attachKeeper, tried for up to 2 s while the keeper still counts a
// lazyd that just died as attached, and for up to 10 s while a keeper holds its lock but does
// not listen yet (one a lazyd started just before it died): that keeper's connection is the
// one the mounts read through, and detaching its mount to start afresh would leave every
// reader of it waiting for ever.
func attachKeeperRetrying(dir string) (*keeperLink, *os.File, string, error) {
	start := time.Now()
	for ; ; time.Sleep(50 * time.Millisecond) {
		link, dev, id, err := attachKeeper(dir)
		switch {
		case err == nil:
			return link, dev, id, nil
		case errors.Is(err, errdefs.ErrConflict) && time.Since(start) < 2*time.Second:
		case errors.Is(err, errdefs.ErrNotFound) && time.Since(start) < 10*time.Second && keeperRuns(dir):
		default:
			return link, dev, id, err
		}
	}
}

// watchKeeper starts another keeper, handing it the connection again, when the current one
// dies.
func (sv *served) watchKeeper() {
	sv.mu.Lock()
	link := sv.link
	sv.mu.Unlock()
	if link == nil || sv.s.cfg.KeeperCommand == nil {
		return
	}
	link.watch(sv.stop, func() {
		sv.s.cfg.Log.Warn("lazyd's keeper died: starting another")
		for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
			select {
			case <-sv.stop:
				return
			default:
			}
			nl, err := startKeeper(sv.s.cfg.Dir, sv.s.cfg.KeeperCommand, sv.s.cfg.RestartCommand, sv.fc.dev, sv.fc.id, sv.s.cfg.Log)
			if err == nil {
				sv.mu.Lock()
				sv.link = nl
				sv.mu.Unlock()
				sv.watchKeeper()
				return
			}
			sv.s.cfg.Log.Error("start lazyd's keeper again", "err", err)
			time.Sleep(backoff)
		}
	})
}

// unmount ends the connection on purpose and lets the keeper go.
func (sv *served) unmount() error {
	close(sv.stop)
	err := sv.fc.unmount()
	sv.mu.Lock()
	if sv.link != nil {
		sv.link.goodbye()
		sv.link = nil
	}
	sv.mu.Unlock()
	return err
}

// detachStaleMount detaches a FUSE mount of ours that a previous lazyd left at mnt (dead when it
// crashed with no keeper; still served when another lazyd of this directory runs, which the
// caller's lock rules out).
func detachStaleMount(mnt string, log *slog.Logger) error {
	if _, err := os.Stat(mnt); errors.Is(err, syscall.ENOTCONN) || isFuseMount(mnt) {
		log.Warn("detaching the FUSE mount a previous lazyd left", "dir", mnt)
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("detach stale FUSE mount %s: %w", mnt, err)
		}
	}
	return nil
}

// DetachDead detaches the FUSE mount under dir (a lazyd's directory) if the lazyd that served it
// died and no keeper held its connection: `corral down` calls it, since no new lazyd may start
// there to do it.
func DetachDead(dir string, log *slog.Logger) error {
	mnt := filepath.Join(dir, mntDir)
	if !isFuseMount(mnt) {
		return nil
	}
	if _, err := os.Stat(mnt); !errors.Is(err, syscall.ENOTCONN) {
		return nil
	}
	return detachStaleMount(mnt, log)
}

// isFuseMount reports whether dir is the mount point of a FUSE filesystem of ours (without a
// request to it: a kept connection waiting for its next lazyd would make a stat wait).
func isFuseMount(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == dir && strings.Contains(line, " - fuse.corral ") {
			return true
		}
	}
	return false
}

func randomID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}
