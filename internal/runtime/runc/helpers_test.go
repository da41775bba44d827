package runc

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"github.com/corral-dev/corral/internal/mountinfo"
	"github.com/corral-dev/corral/internal/runtime"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Fixtures shared by the root tests, built once by TestMain when the host can run them.
var fx struct {
	once    sync.Once
	err     error
	dir     string // holds everything below
	base    string // busybox layer
	top     string // a layer over base
	agent   string // the stand-in agent binary
	runc    string
	runcd   string // corral-runcd, built from cmd/corral-runcd
	skipMsg string
}

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		helperMain()
		return
	}
	code := m.Run()
	if fx.dir != "" {
		os.RemoveAll(fx.dir)
	}
	os.Exit(code)
}

// needRoot skips unless the host can run real sandboxes, and builds the fixtures once.
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates mounts, loop devices and cgroups")
	}
	fx.once.Do(buildFixtures)
	if fx.skipMsg != "" {
		t.Skip(fx.skipMsg)
	}
	if fx.err != nil {
		t.Fatalf("build fixtures: %v", fx.err)
	}
}

func runcPath() string {
	if p := os.Getenv("CORRAL_RUNC"); p != "" {
		return p
	}
	return DefaultRunc
}

func buildFixtures() {
	fx.runc = runcPath()
	if _, err := os.Stat(fx.runc); err != nil {
		fx.skipMsg = fmt.Sprintf("needs runc at %s (scripts/install-runc.sh builds it; or set CORRAL_RUNC)", fx.runc)
		return
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		fx.skipMsg = "needs busybox-static at /bin/busybox"
		return
	}
	if _, err := exec.LookPath("go"); err != nil {
		fx.skipMsg = "needs the go tool to build the stand-in agent"
		return
	}
	fx.dir, fx.err = os.MkdirTemp("", "corral-runc-fx")
	if fx.err != nil {
		return
	}
	// Searchable by anyone, as an installed corral-runcd's directory is: a sandbox's uid runs it
	// as the user namespaces' helper (initNSHelper).
	if fx.err = os.Chmod(fx.dir, 0o755); fx.err != nil {
		return
	}
	fx.base = filepath.Join(fx.dir, "base")
	fx.top = filepath.Join(fx.dir, "top")
	fx.agent = filepath.Join(fx.dir, "standin")
	fx.err = makeBusyboxLayer(fx.base)
	if fx.err != nil {
		return
	}
	for p, content := range map[string]string{
		"base/etc/corral-layer": "base\n", "base/etc/only-base": "yes\n", "top/etc/corral-layer": "top\n",
	} {
		p = filepath.Join(fx.dir, p)
		if fx.err = os.MkdirAll(filepath.Dir(p), 0o755); fx.err != nil {
			return
		}
		if fx.err = os.WriteFile(p, []byte(content), 0o644); fx.err != nil {
			return
		}
	}
	cmd := exec.Command("go", "build", "-o", fx.agent, "./testdata/standin")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fx.err = fmt.Errorf("build stand-in agent: %v: %s", err, out)
		return
	}
	fx.runcd = filepath.Join(fx.dir, "corral-runcd")
	cmd = exec.Command("go", "build", "-o", fx.runcd, "../../../cmd/corral-runcd")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		fx.err = fmt.Errorf("build corral-runcd: %v: %s", err, out)
	}
}

// makeBusyboxLayer makes a root filesystem of busybox-static with every applet linked in /bin.
func makeBusyboxLayer(dir string) error {
	for _, d := range []string{"bin", "etc", "proc", "sys", "dev", "root", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return err
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), bb, 0o755); err != nil {
		return err
	}
	out, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", applet)); err != nil && !os.IsExist(err) {
			return err
		}
	}
	return nil
}

// testEnv is one Runtime on private directories and a private cgroup parent, torn down (and
// checked for leaks) at the end of the test, pass or fail.
type testEnv struct {
	t      testing.TB
	r      *Runtime
	cfg    Config
	top    string
	parent string
}

func newTestEnv(t testing.TB, tweak func(*Config)) *testEnv {
	t.Helper()
	needRoot(t)
	// /tmp, not t.TempDir(): the agent socket path must fit in 107 bytes.
	top, err := os.MkdirTemp("/tmp", "crt")
	if err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	rand.Read(b[:])
	e := &testEnv{t: t, top: top, parent: "/corral-test-" + hex.EncodeToString(b[:])}
	e.cfg = Config{
		Runc:             fx.runc,
		StateDir:         filepath.Join(top, "s"),
		RuncRoot:         filepath.Join(top, "r"),
		CgroupParent:     e.parent,
		DefaultDiskBytes: 64 << 20,
		DiskPool:         2,
		Runcd:            fx.runcd, // as corral up has it; tests of runc run --detach clear it
	}
	if os.Getenv("CORRAL_TEST_RUNCD") == "off" {
		e.cfg.Runcd = "" // every test with runc run --detach
	}
	if os.Getenv("CORRAL_TEST_USERNS") != "" {
		// Every test of the package in user namespaces: a range far from any Corral's.
		e.cfg.UserNS = &UserNS{UIDBase: 0xF0000000 + uint32(b[0]%64)*4*UserNSSize, Slots: 4}
	}
	if tweak != nil {
		tweak(&e.cfg)
	}
	t.Cleanup(e.teardown)
	e.r = e.open()
	return e
}

func (e *testEnv) open() *Runtime {
	e.t.Helper()
	log := slog.New(slog.NewTextHandler(testWriter{e.t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	r, err := New(context.Background(), e.cfg, log)
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	return r
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func (e *testEnv) spec(id string) Spec {
	return resolved(Spec{
		ID:        id,
		Lower:     []string{fx.base, fx.top},
		AgentPath: fx.agent,
		AgentArgs: []string{"serve"},
	})
}

// resolved gives s's zero limits the values admission resolves (internal/limits owns them;
// the runtime defaults none), with the tests' small disk.
func resolved(s Spec) Spec {
	if s.CPUs == 0 {
		s.CPUs = 1
	}
	if s.MemoryBytes == 0 {
		s.MemoryBytes = 512 << 20
	}
	if s.Pids == 0 {
		s.Pids = 1024
	}
	if s.DiskBytes == 0 {
		s.DiskBytes = 64 << 20
	}
	if s.OpenFiles == 0 {
		s.OpenFiles = 1000
	}
	if s.ShmBytes == 0 {
		s.ShmBytes = testShmBytes
	}
	return s
}

const testShmBytes = 64 << 20

func (e *testEnv) create(s Spec) *runtime.Sandbox {
	e.t.Helper()
	sb, err := e.r.Create(context.Background(), runtime.Spec(s))
	if err != nil {
		e.t.Fatalf("Create(%s): %v", s.ID, err)
	}
	return sb
}

// teardown deletes every sandbox, closes the runtime and reports anything left on the host.
func (e *testEnv) teardown() {
	ctx := context.Background()
	if e.r == nil {
		// A test handed its Runtime to another process; a new one clears what that left.
		if r, err := New(ctx, e.cfg, nil); err != nil {
			e.t.Errorf("teardown: New: %v", err)
		} else {
			e.r = r
		}
	}
	if e.r != nil {
		ids, err := e.r.List(ctx)
		if err != nil {
			e.t.Errorf("teardown: List: %v", err)
		}
		for _, id := range ids {
			if err := e.r.Delete(ctx, id); err != nil {
				e.t.Errorf("teardown: Delete(%s): %v", id, err)
			}
		}
		if err := e.r.Close(); err != nil {
			e.t.Errorf("teardown: Close: %v", err)
		}
		if u := e.r.cfg.UserNS; u != nil {
			if _, err := os.Lstat(u.RootsDir); err == nil {
				e.t.Errorf("leak: RootsDir %s left after Close", u.RootsDir)
			}
		}
		for _, leak := range e.leaks() {
			e.t.Errorf("leak: %s", leak)
		}
	}
	// Whatever happened, leave the host clean for the next test.
	for _, h := range e.hierarchies() {
		os.Remove(filepath.Join(h, e.parent))
	}
	if mps, _ := mountinfo.Under(e.top); len(mps) == 0 && os.Getenv("KEEP") == "" {
		os.RemoveAll(e.top)
	}
}

func (e *testEnv) hierarchies() []string {
	if e.r != nil {
		return e.r.cg.Hier
	}
	return nil
}

// leaks lists what the runtime left on the host: mounts, loop devices, cgroups, runc state,
// processes, files.
func (e *testEnv) leaks() []string {
	var leaks []string
	if mps, err := mountinfo.Under(e.cfg.StateDir); err != nil || len(mps) > 0 {
		leaks = append(leaks, fmt.Sprintf("mounts under StateDir: %v %v", mps, err))
	}
	if e.r != nil && e.r.cfg.UserNS != nil {
		roots := e.r.cfg.UserNS.RootsDir
		if mps, err := mountinfo.Under(roots); err != nil || len(mps) > 0 {
			leaks = append(leaks, fmt.Sprintf("mounts under RootsDir: %v %v", mps, err))
		}
		if ents, _ := os.ReadDir(roots); len(ents) > 0 {
			leaks = append(leaks, fmt.Sprintf("rootfs mount points left in %s: %d", roots, len(ents)))
		}
	}
	// Autoclear detaches a loop device when its last user goes; allow the kernel a moment.
	deadline := time.Now().Add(3 * time.Second)
	for len(loopsBackedUnder(e.cfg.StateDir, nil)) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if l := loopsBackedUnder(e.cfg.StateDir, nil); len(l) > 0 {
		leaks = append(leaks, fmt.Sprintf("loop devices: %v", l))
	}
	for _, h := range e.hierarchies() {
		ents, _ := os.ReadDir(filepath.Join(h, e.parent))
		for _, ent := range ents {
			if ent.IsDir() {
				leaks = append(leaks, "cgroup "+filepath.Join(h, e.parent, ent.Name()))
			}
		}
	}
	if out, err := exec.Command(e.cfg.Runc, "--root", e.cfg.RuncRoot, "list", "-q").Output(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		leaks = append(leaks, fmt.Sprintf("runc containers: %q %v", out, err))
	}
	if ents, _ := os.ReadDir(e.cfg.RuncRoot); len(ents) > 0 {
		// corral-runcd's socket is there while the runtime is open (Close removes it).
		if e.r == nil || e.r.engine == nil || !e.r.engine.open() || len(ents) > 1 || ents[0].Name() != filepath.Base(e.r.engine.sock) {
			leaks = append(leaks, fmt.Sprintf("runc state: %d entries", len(ents)))
		}
	}
	if e.cfg.RunscRoot != "" {
		if ents, _ := os.ReadDir(e.cfg.RunscRoot); len(ents) > 0 {
			var names []string
			for _, ent := range ents {
				names = append(names, ent.Name())
			}
			leaks = append(leaks, fmt.Sprintf("runsc state: %v", names))
		}
	}
	if ents, _ := os.ReadDir(e.cfg.StateDir); len(ents) > 0 {
		var names []string
		for _, ent := range ents {
			names = append(names, ent.Name())
		}
		leaks = append(leaks, fmt.Sprintf("StateDir not empty: %v", names))
	}
	// A killed agent stays a zombie until the host's init (or a subreaper) reaps it, which is
	// not ours to hurry; it holds nothing but a pid. Live processes are leaks.
	var live []string
	for range 200 {
		live = live[:0]
		procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
		for _, p := range procs {
			b, _ := os.ReadFile(p)
			if !strings.Contains(string(b), e.parent+"/") {
				continue
			}
			stat, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "stat"))
			if f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])); len(f) > 0 && f[0] == "Z" {
				continue
			}
			live = append(live, fmt.Sprintf("process %s (%s) in %s", filepath.Base(filepath.Dir(p)), bytes.TrimSpace(stat), e.parent))
		}
		if len(live) == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return append(leaks, live...)
}

// result is the stand-in agent's answer.
type result struct {
	Out  string `json:"out"`
	Code int    `json:"code"`
}

// sh runs a shell command line inside the sandbox through the stand-in agent.
func sh(t testing.TB, sock, cmdline string) result {
	t.Helper()
	res, err := trySh(sock, cmdline)
	if err != nil {
		t.Fatalf("sh %q: %v", cmdline, err)
	}
	return res
}

func trySh(sock, cmdline string) (result, error) {
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return result{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := fmt.Fprintf(c, "%s\n", cmdline); err != nil {
		return result{}, err
	}
	var res result
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		return result{}, fmt.Errorf("read answer: %w", err)
	}
	return res, json.Unmarshal(line, &res)
}

// okSh runs cmdline and fails the test unless it exits 0; it returns the trimmed output.
func okSh(t testing.TB, sock, cmdline string) string {
	t.Helper()
	res := sh(t, sock, cmdline)
	if res.Code != 0 {
		t.Fatalf("sh %q: exit %d: %s", cmdline, res.Code, res.Out)
	}
	return strings.TrimSpace(res.Out)
}
