package lxcfs

import (
	"context"
	"github.com/corral-dev/corral/internal/mountinfo"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/doccheck"
)

func startServer(t *testing.T) *Server {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (FUSE mounts)")
	}
	if _, err := findBinary(""); err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	s, err := Start(context.Background(), Config{Dir: filepath.Join(dir, "lxcfs")}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// TestRestartReachesSlaveBinds kills LXCFS with SIGKILL and checks that a slave bind of a view
// file (what a sandbox has) reads the next LXCFS's file, and that Stop leaves nothing.
func TestRestartReachesSlaveBinds(t *testing.T) {
	s := startServer(t)
	binds, err := s.Files(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(binds) != len(served) {
		t.Fatalf("%d binds, want %d", len(binds), len(served))
	}
	var meminfo string
	for _, b := range binds {
		if b.Target == "/proc/meminfo" {
			meminfo = b.Source
		}
	}
	// A sandbox's bind: made from the shared view file, then made a slave.
	target := filepath.Join(t.TempDir(), "meminfo")
	if err := os.WriteFile(target, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(meminfo, target, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for unix.Unmount(target, unix.MNT_DETACH) == nil {
		}
	})
	if err := unix.Mount("", target, "", unix.MS_SLAVE, ""); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(target); err != nil || !strings.Contains(string(b), "MemTotal:") {
		t.Fatalf("read through the bind: %v %.40q", err, b)
	}
	// Writes are refused: the view's binds are read-only.
	if err := os.WriteFile(meminfo, []byte("x"), 0o444); err == nil {
		t.Fatal("wrote to a view file")
	}
	pid := s.Pid()
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.Restarts() < 1 || s.Pid() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("lxcfs was not restarted within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if s.Pid() == pid {
		t.Fatalf("same pid %d after the restart", pid)
	}
	if b, err := os.ReadFile(target); err != nil || !strings.Contains(string(b), "MemTotal:") {
		t.Fatalf("read through the bind after the restart: %v %.40q", err, b)
	}
}

// TestAdopt starts a second Server on a live directory: it adopts the LXCFS running there.
func TestAdopt(t *testing.T) {
	s := startServer(t)
	pid := s.Pid()
	s.Close()
	s2, err := Start(context.Background(), s.cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if s2.Pid() != pid {
		t.Fatalf("the second Server runs pid %d, want the adopted %d", s2.Pid(), pid)
	}
}

// TestAdoptMakesViewReadOnly: the view a Corral before read-only views left (writable) is made
// read-only when its LXCFS is adopted: a sandbox's bind of a view file takes the view's flags
// in the moment no LXCFS file is on top of it.
func TestAdoptMakesViewReadOnly(t *testing.T) {
	s := startServer(t)
	s.Close()
	if err := unix.Mount("", s.view, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		t.Fatal(err)
	}
	if viewReadOnly(t, s.view) {
		t.Fatal("the view is still read-only after a read-write remount")
	}
	s2, err := Start(context.Background(), s.cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if !viewReadOnly(t, s2.view) {
		t.Error("the adopted LXCFS's view is writable")
	}
}

func viewReadOnly(t *testing.T, view string) bool {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(view, &st); err != nil {
		t.Fatal(err)
	}
	return st.Flags&unix.ST_RDONLY != 0
}

// TestNoAdoptOfBareView: an LXCFS runs but a view file has no LXCFS file on top (a crash between
// making the view and binding): the view's own empty file reads fine, yet the next Start must
// not adopt that LXCFS, or sandboxes would bind the empty file.
func TestNoAdoptOfBareView(t *testing.T) {
	s := startServer(t)
	pid := s.Pid()
	s.Close()
	meminfo := filepath.Join(s.view, "meminfo")
	if err := unix.Unmount(meminfo, 0); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(meminfo); err != nil || len(b) != 0 {
		t.Fatalf("bare view file: %q, %v; want it empty and readable", b, err)
	}
	s2, err := Start(context.Background(), s.cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if s2.Pid() == pid {
		t.Errorf("Start adopted LXCFS %d with a bare view file", pid)
	}
	if b, err := os.ReadFile(meminfo); err != nil || !strings.Contains(string(b), "MemTotal") {
		t.Errorf("view meminfo after Start: %.80q, %v", b, err)
	}
}

// TestStartAfterDeadLXCFS: LXCFS died while no Server supervised it (corral was down), leaving
// its FUSE mount dead (stat: ENOTCONN, mkdir: EEXIST) and the view's binds on top. The next Start
// replaces it rather than failing (seen on a host after a crash: "create lxcfs dir: mkdir
// .../mnt: file exists", and sandboxes saw the host's /proc).
func TestStartAfterDeadLXCFS(t *testing.T) {
	s := startServer(t)
	pid := s.Pid()
	s.Close()
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(s.cfg.Dir, "mnt")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(mnt); err != nil {
			break // ENOTCONN: the mount is dead
		}
		if time.Now().After(deadline) {
			t.Fatal("the killed LXCFS's mount still answers")
		}
	}
	s2, err := Start(context.Background(), s.cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("start over a dead LXCFS: %v", err)
	}
	t.Cleanup(func() { s2.Stop() })
	if s2.Pid() == pid || s2.Pid() == 0 {
		t.Fatalf("the second Server runs pid %d (the dead one was %d)", s2.Pid(), pid)
	}
	binds, err := s2.Files(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range binds {
		if _, err := os.ReadFile(b.Source); err != nil {
			t.Errorf("view file %s after the restart: %v", b.Source, err)
		}
	}
}

func TestStopLeavesNothing(t *testing.T) {
	s := startServer(t)
	pid := s.Pid()
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if mps, _ := mountinfo.Under(s.cfg.Dir); len(mps) > 0 {
		t.Fatalf("mounts left: %v", mps)
	}
	if _, err := os.Stat(s.cfg.Dir); !os.IsNotExist(err) {
		t.Fatalf("%s left: %v", s.cfg.Dir, err)
	}
	if _, err := os.Stat(ViewDir(s.cfg.Dir)); !os.IsNotExist(err) {
		t.Fatalf("view %s left: %v", ViewDir(s.cfg.Dir), err)
	}
	// Gone, or a zombie about to be reaped by the Server's Wait.
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil && !strings.Contains(string(b), ") Z ") {
		t.Fatalf("lxcfs %d still runs: %s", pid, b)
	}
}

// TestViewReachable reads every bind source as an unprivileged host uid, which is what a
// sandbox's runc init is in its user namespace: it binds them itself, with no round trip
// through runc's parent per file.
func TestViewReachable(t *testing.T) {
	s := startServer(t)
	binds, err := s.Files(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	args := []string{}
	for _, b := range binds {
		if !strings.HasPrefix(b.Source, ViewDir(s.cfg.Dir)+"/") {
			t.Errorf("bind source %s is not in the view %s", b.Source, ViewDir(s.cfg.Dir))
		}
		args = append(args, b.Source)
	}
	cmd := exec.Command("cat", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "MemTotal:") {
		t.Fatalf("uid 65534 cannot read the view: %v: %.200s", err, out)
	}
	// The directory holding the pid file and the FUSE mount stays private.
	if st, err := os.Stat(s.cfg.Dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("%s: %v %v, want 0700", s.cfg.Dir, st.Mode(), err)
	}
}

// TestLegacyView starts on a directory whose view a Corral before ViewDir made at <dir>/view:
// its sandboxes' binds come from there, so it gets the new LXCFS's files too, and Stop removes
// it with the rest.
func TestLegacyView(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (FUSE mounts)")
	}
	if _, err := findBinary(""); err != nil {
		t.Skip(err)
	}
	dir := filepath.Join(t.TempDir(), "lxcfs")
	legacy := filepath.Join(dir, "view")
	if err := os.MkdirAll(legacy, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", legacy, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	for _, f := range served {
		if err := os.WriteFile(filepath.Join(legacy, f.name), nil, 0o444); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Start(context.Background(), Config{Dir: dir}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(legacy, "meminfo")); err != nil || !strings.Contains(string(b), "MemTotal:") {
		t.Errorf("legacy view: %v %.40q", err, b)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if mps, _ := mountinfo.Under(dir); len(mps) > 0 {
		t.Fatalf("mounts left: %v", mps)
	}
}

func TestExportedDocs(t *testing.T) { doccheck.Exported(t, ".") }
