// Package e2e tests Corral end to end: the real `corral up` binary, the real corral-agent, real runc,
// overlay and loop mounts, driven through the Go SDK and the CLI binary. Every test needs root and
// skips with a clear message without it.
package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/hostreg"
	"github.com/corral-dev/corral/internal/layers"
	"github.com/corral-dev/corral/internal/runtime/backends"
	"github.com/corral-dev/corral/internal/store/pgtest"
	corral "github.com/corral-dev/corral/sdk/go"
)

var (
	binDir     string // holds corral and corral-agent
	repoRoot   string
	setupErr   error
	setupOnce  sync.Once
	rootfsOnce sync.Once
	rootfsDir  string
	rootfsErr  error
)

func TestMain(m *testing.M) {
	_, file, _, _ := runtime.Caller(0)
	repoRoot = filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	code := m.Run()
	pgtest.Stop()
	if binDir != "" && os.Getenv("CORRAL_BIN") == "" {
		os.RemoveAll(binDir)
	}
	if rootfsDir != "" {
		os.RemoveAll(filepath.Dir(rootfsDir))
	}
	os.Exit(code)
}

// needRoot skips the test unless it runs as root with runc available.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: end-to-end tests mount filesystems and run runc (run `make test` as root)")
	}
	if runcPath() == "" {
		t.Skip("needs runc: run scripts/install-runc.sh (make setup)")
	}
	setupOnce.Do(func() {
		if d := os.Getenv("CORRAL_BIN"); d != "" {
			binDir = d
			return
		}
		binDir, setupErr = os.MkdirTemp("", "corral-e2e-bin-")
		if setupErr != nil {
			return
		}
		for _, b := range []struct {
			out, pkg string
			static   bool
		}{
			{"corral", "./cmd/corral", false}, {"corral-agent", "./cmd/corral-agent", true},
		} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, b.out), b.pkg)
			cmd.Dir = repoRoot
			cmd.Env = os.Environ()
			if b.static {
				cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
			}
			if out, err := cmd.CombinedOutput(); err != nil {
				setupErr = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
				return
			}
		}
	})
	if setupErr != nil {
		t.Fatal(setupErr)
	}
}

func runcPath() string {
	if p := os.Getenv("CORRAL_RUNC"); p != "" {
		return p
	}
	if _, err := os.Stat(backends.DefaultRunc); err == nil {
		return backends.DefaultRunc
	}
	return ""
}

// busyboxRootfs returns a directory holding the busybox base rootfs (built once per test binary).
func busyboxRootfs(t *testing.T) string {
	t.Helper()
	rootfsOnce.Do(func() {
		dir, err := os.MkdirTemp("", "corral-e2e-rootfs-")
		if err != nil {
			rootfsErr = err
			return
		}
		rootfsDir = filepath.Join(dir, "rootfs")
		out, err := exec.Command(filepath.Join(repoRoot, "scripts", "busybox-rootfs.sh"), rootfsDir).CombinedOutput()
		if err != nil {
			rootfsErr = fmt.Errorf("busybox-rootfs.sh: %v\n%s", err, out)
		}
	})
	if rootfsErr != nil {
		t.Fatal(rootfsErr)
	}
	return rootfsDir
}

// corralProc is one running `corral up`.
type corralProc struct {
	t        *testing.T
	URL      string
	Token    string
	DataDir  string
	Cgroup   string
	Listen   string
	Client   *corral.Client
	cmd      *exec.Cmd
	logs     *bytes.Buffer
	waitDone chan struct{}
	exitErr  error // how corral up ended (set before waitDone closes)
	extra    []string
	// runtime is what create asks for when the request names none ("" = the server's default).
	runtime string
	// NetTag and NetPool keep this instance's sandbox networks apart from every other's.
	NetTag, NetPool string
	// VMUIDBase is the first uid of the instance's VMs (hostreg.VMUIDCount of them).
	VMUIDBase uint32
	// redraws counts how often start drew other host resources after a registry refusal.
	redraws int
	// auto starts corral up without --net-tag, --net-pool and --cgroup-parent: the host
	// registry chooses them, and start reads them back from it.
	auto bool
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startCorral starts `corral up` on a fresh data dir and cgroup parent; it is stopped, and every
// sandbox it left deleted, when the test ends.
func startCorral(t *testing.T, extra ...string) *corralProc {
	t.Helper()
	needRoot(t)
	// Short paths: agent sockets live under the data dir and sun_path holds 108 bytes.
	dataDir, err := os.MkdirTemp("", "crl-")
	if err != nil {
		t.Fatal(err)
	}
	p := &corralProc{t: t, DataDir: dataDir, Listen: freePort(t), extra: extra}
	p.pickHostResources()
	// An extra --listen (the last one wins) names another address; the harness talks to its port
	// on loopback.
	for i, a := range extra {
		if a == "--listen" && i+1 < len(extra) {
			if _, port, err := net.SplitHostPort(extra[i+1]); err == nil {
				p.Listen = "127.0.0.1:" + port
			}
		}
	}
	p.URL = "http://" + p.Listen
	p.start()
	t.Cleanup(func() {
		p.cleanup()
		os.RemoveAll(dataDir)
	})
	return p
}

// startCorralAuto is startCorral with the host registry choosing the instance's cgroup parent,
// network tag and pool, as it does for an operator who passes none.
func startCorralAuto(t *testing.T, extra ...string) *corralProc {
	t.Helper()
	needRoot(t)
	dataDir, err := os.MkdirTemp("", "crl-")
	if err != nil {
		t.Fatal(err)
	}
	p := &corralProc{t: t, DataDir: dataDir, Listen: freePort(t), extra: extra, auto: true}
	p.URL = "http://" + p.Listen
	p.start()
	t.Cleanup(func() {
		p.cleanup()
		os.RemoveAll(dataDir)
	})
	return p
}

// pickHostResources draws the instance's cgroup parent, network tag and pool at random: outside
// 10.200-10.249, where the host registry chooses pools for Corrals started without --net-pool (a
// `make run` Corral beside the tests has one of those).
func (p *corralProc) pickHostResources() {
	b := make([]byte, 2)
	rand.Read(b)
	p.Cgroup = "/corral-e2e-" + randHex(4)
	p.NetTag = hex.EncodeToString(b)
	p.NetPool = fmt.Sprintf("10.%d.%d.0/24", 254+int(b[0])%2, b[1])
}

func (p *corralProc) start() {
	t := p.t
	t.Helper()
	// 256 MiB disks: writable disks take their whole size on the host (allocated when made), and
	// the e2e Corrals of several people share this host's disk.
	args := []string{"up", "--data-dir", p.DataDir, "--listen", p.Listen, "--runc", runcPath(), "--disk-pool", "1", "--sandbox-disk", "256M", "--log-level", "debug"}
	if !p.auto {
		args = append(args, "--cgroup-parent", p.Cgroup, "--net-tag", p.NetTag, "--net-pool", p.NetPool)
	}
	args = append(args, p.extra...)
	p.cmd = exec.Command(filepath.Join(binDir, "corral"), args...)
	p.logs = &bytes.Buffer{}
	p.cmd.Stdout, p.cmd.Stderr = &lockedWriter{w: p.logs}, &lockedWriter{w: p.logs}
	// Its own process group, so a kill -9 of it is exactly that and nothing else.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.waitDone = make(chan struct{})
	go func() { p.exitErr = p.cmd.Wait(); close(p.waitDone) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(p.URL + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case <-p.waitDone:
			// Another Corral on the host (a test that left its data dir, a run beside this one)
			// holds what was drawn: the host registry refused it, so draw again.
			if logs := p.Logs(); !p.auto && p.redraws < 5 && strings.Contains(logs, "another Corral (data dir ") {
				p.redraws++
				t.Logf("host resources taken, drawing others: %s", strings.TrimSpace(logs))
				p.pickHostResources()
				p.start()
				return
			}
			t.Fatalf("corral up exited early:\n%s", p.Logs())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("corral up not healthy after 30s:\n%s", p.Logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// What the host registry gave this data dir: with auto, its cgroup, tag and pool; always,
	// its VM uid range (which tells its QEMUs from other instances').
	reg, err := hostreg.Open("")
	if err != nil {
		t.Fatal(err)
	}
	claims, err := reg.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claims {
		if c.DataDir == p.DataDir {
			p.VMUIDBase = c.VMUIDBase
			if p.auto {
				p.Cgroup, p.NetTag, p.NetPool = c.CgroupParent, c.Tag, c.Pool
			}
		}
	}
	if p.VMUIDBase == 0 {
		t.Fatalf("no host registry claim for %s: %+v", p.DataDir, claims)
	}
	tok, err := os.ReadFile(filepath.Join(p.DataDir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	p.Token = strings.TrimSpace(string(tok))
	p.Client = corral.New(p.URL, p.Token)
}

// Logs returns what corral up printed so far.
func (p *corralProc) Logs() string {
	lw := p.cmd.Stderr.(*lockedWriter)
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return p.logs.String()
}

// keepLog writes a process's log to a file for a failed test and names it in t's output with
// the log's last error lines (a failed create's error carries the VM console's tail). CI shows
// only the tail of the test output: logs in full there pushed the failures themselves out of it.
// dir groups one test's logs; "" makes a directory for this one.
func keepLog(t *testing.T, dir, name, logs string) {
	if dir == "" {
		dir = failedLogDir(t)
	}
	path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".log")
	if err := os.WriteFile(path, []byte(logs), 0o644); err != nil {
		t.Logf("%s log (not kept: %v):\n%s", name, err, logs)
		return
	}
	lines := strings.Split(strings.TrimRight(logs, "\n"), "\n")
	var errs []string
	for _, l := range lines {
		if strings.Contains(l, " level=ERROR ") {
			errs = append(errs, l)
		}
	}
	const lastErrors = 3
	t.Logf("%s log: %s (%d lines, %d errors)%s", name, path, len(lines), len(errs),
		strings.Join(append([]string{""}, errs[max(0, len(errs)-lastErrors):]...), "\n"))
}

// failedLogDir makes a directory outside the test's own (which is removed) for its logs.
func failedLogDir(t *testing.T) string {
	dir := filepath.Join(os.TempDir(), "corral-e2e-logs", strings.ReplaceAll(t.Name(), "/", "_")+"-"+randHex(3))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("keep the logs: %v", err)
	}
	return dir
}

// Kill9 kills corral up with SIGKILL and waits for it to be gone.
func (p *corralProc) Kill9() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.waitDone
}

// Restart starts corral up again on the same data dir and address.
func (p *corralProc) Restart() { p.start() }

// Stop sends SIGTERM and waits.
func (p *corralProc) Stop() {
	select {
	case <-p.waitDone:
		return // it had exited already (killed by the test, or `corral down`)
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.waitDone:
		if p.exitErr != nil {
			p.t.Errorf("corral up ended with %v after SIGTERM (it must exit 0)", p.exitErr)
		}
	case <-time.After(15 * time.Second):
		p.t.Errorf("corral up did not exit within 15s of SIGTERM")
		p.Kill9()
	}
}

func (p *corralProc) cleanup() {
	select {
	case <-p.waitDone:
		p.downLeftovers()
	default:
		defer p.checkLazyd()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// Fncall environments first: their pools would replace deleted containers.
		if envs, err := p.Client.FncallEnvs(ctx); err == nil {
			for _, env := range envs {
				p.Client.DeleteFncallEnv(ctx, env.Name)
			}
		}
		if list, err := p.Client.ListSandboxes(ctx, corral.ListOptions{}); err == nil {
			for _, sb := range list {
				if sb.State == corral.StateRunning || sb.State == corral.StateCreating {
					p.Client.DeleteSandbox(ctx, sb.ID)
				}
			}
		}
		p.Stop()
	}
	if p.t.Failed() {
		keepLog(p.t, "", "corral up", p.Logs())
	}
	// VMs outlive corral up (a test that failed with it killed leaves them): end them.
	vms, _ := os.ReadDir(filepath.Join(p.DataDir, "vms"))
	for _, vm := range vms {
		for _, pid := range qemuPids(vm.Name()) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	// The per-test cgroup parent itself (empty by now) goes too, and corral's own control
	// cgroup beside it (emptied when corral up exited).
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + p.Cgroup)
	more, _ := filepath.Glob("/sys/fs/cgroup/*/*" + p.Cgroup)
	ctl, _ := filepath.Glob("/sys/fs/cgroup/*" + p.Cgroup + "-ctl")
	more = append(more, ctl...)
	for _, d := range append(dirs, more...) {
		os.Remove(d)
	}
}

// downLeftovers runs corral down on the data dir of a corral up that is gone (killed by the
// test, crashed, or a restart that failed) when something of it is still on the host: what it
// keeps for its next start on purpose (lazyd and its FUSE mount, LXCFS, sandboxes and their
// mounts) would otherwise stay behind the test.
func (p *corralProc) downLeftovers() {
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if len(lazydPids(p.DataDir)) == 0 && !strings.Contains(string(mi), " "+p.DataDir+"/") {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "corral"), "down", "--data-dir", p.DataDir, "--runc", runcPath()).CombinedOutput()
	if err != nil {
		p.t.Errorf("corral down of the data dir the stopped corral up left things in: %v\n%s", err, out)
	}
}

// checkLazyd fails the test if the lazyd of p's data dir outlives a corral up that stopped with
// no sandbox left (it must exit once idle), and removes it either way.
func (p *corralProc) checkLazyd() {
	deadline := time.Now().Add(10 * time.Second)
	for len(lazydPids(p.DataDir)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	pids := lazydPids(p.DataDir)
	if len(pids) == 0 {
		// lazyd's keeper exits with it.
		for len(lazydKeeperPids(p.DataDir)) > 0 && time.Now().Before(deadline.Add(5*time.Second)) {
			time.Sleep(50 * time.Millisecond)
		}
		if k := lazydKeeperPids(p.DataDir); len(k) > 0 {
			p.t.Errorf("lazyd's keeper %v outlives lazyd of %s", k, p.DataDir)
			for _, pid := range k {
				if n, err := strconv.Atoi(pid); err == nil {
					syscall.Kill(n, syscall.SIGKILL)
				}
			}
		}
		return
	}
	log, _ := os.ReadFile(filepath.Join(p.DataDir, "layers", "lazy", "lazyd.log"))
	if len(log) > 4000 {
		log = log[len(log)-4000:]
	}
	p.t.Errorf("lazyd %v still serves %s 10 s after corral up stopped with no sandbox; its log ends:\n%s", pids, p.DataDir, log)
	// Its keeper first: it would start another.
	for _, pid := range append(lazydKeeperPids(p.DataDir), pids...) {
		if n, err := strconv.Atoi(pid); err == nil {
			syscall.Kill(n, syscall.SIGKILL)
		}
	}
	syscall.Unmount(filepath.Join(p.DataDir, "layers", "lazy", "mnt"), syscall.MNT_DETACH)
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// importDir publishes dir as name:version of kind, in the root project (so usable there only).
func (p *corralProc) importDir(name, version, kind, dir string) *corral.Layer {
	p.t.Helper()
	return p.importDirWith(p.Client, name, version, kind, dir, corral.ImportOptions{})
}

// importDirWith publishes dir as name:version of kind through c, with opt.
func (p *corralProc) importDirWith(c *corral.Client, name, version, kind, dir string, opt corral.ImportOptions) *corral.Layer {
	p.t.Helper()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(layers.WriteTar(context.Background(), dir, pw)) }()
	l, err := c.ImportLayerWith(context.Background(), name, version, kind, opt, pr)
	if err != nil {
		p.t.Fatalf("import %s:%s: %v", name, version, err)
	}
	return l
}

// withBase starts corral and publishes the busybox rootfs as base:test, public: the operator's
// base image for every project.
func withBase(t *testing.T, extra ...string) *corralProc {
	p := startCorral(t, extra...)
	p.importDirWith(p.Client, "base", "test", corral.KindBase, busyboxRootfs(t), corral.ImportOptions{Public: true})
	return p
}

// forRuntimes runs f as subtests "runc", "gvisor" and "microvm" (the microvm tier, QEMU); the
// gVisor one skips when runsc is not installed (scripts/install-runsc.sh), the microvm one when
// QEMU or the guest kernel is missing (scripts/setup.sh).
func forRuntimes(t *testing.T, f func(t *testing.T, rt string)) {
	for _, rt := range []string{"runc", "gvisor", "microvm"} {
		t.Run(rt, func(t *testing.T) {
			switch rt {
			case "gvisor":
				needGVisor(t)
			case "microvm":
				needMicroVM(t)
			}
			f(t, rt)
		})
	}
}

func needGVisor(t *testing.T) {
	t.Helper()
	p := os.Getenv("CORRAL_RUNSC")
	if p == "" {
		p = backends.DefaultRunsc
	}
	if _, err := os.Stat(p); err != nil {
		t.Skipf("needs gVisor's runsc at %s (scripts/install-runsc.sh builds it; or set CORRAL_RUNSC)", p)
	}
}

// withBaseOn is withBase whose sandboxes run on runtime rt by default.
func withBaseOn(t *testing.T, rt string, extra ...string) *corralProc {
	p := withBase(t, extra...)
	p.runtime = rt
	return p
}

// create makes a sandbox on base:test, deleted at the end of the test.
func (p *corralProc) create(req corral.CreateRequest) *corral.Sandbox {
	p.t.Helper()
	switch {
	case p.runtime == "microvm" && req.Tier == "":
		// The microvm tier: "runtime" microvm is the harness's name for it.
		req.Tier = "microvm"
		if req.Limits.MemoryBytes == 0 {
			req.Limits.MemoryBytes = 256 << 20
		}
	case req.Runtime == "" && p.runtime != "microvm":
		req.Runtime = p.runtime
	}
	if req.Base == "" && req.FromSnapshot == "" && req.Environment == "" {
		req.Base = "base:test"
	}
	sb, err := p.Client.CreateSandbox(context.Background(), req)
	if err != nil {
		p.t.Fatalf("create sandbox: %v", err)
	}
	if sb.State != corral.StateRunning {
		p.t.Fatalf("new sandbox state = %q, want running", sb.State)
	}
	return sb
}

// run executes argv in a sandbox and returns stdout, stderr and the exit.
func (p *corralProc) run(id string, argv ...string) (string, string, *corral.Exit) {
	p.t.Helper()
	return p.runReq(id, corral.ExecRequest{Argv: argv})
}

func (p *corralProc) runReq(id string, req corral.ExecRequest) (string, string, *corral.Exit) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stdout, stderr, exit, err := p.Client.Run(ctx, id, req)
	if err != nil {
		p.t.Fatalf("exec %q: %v", req.Argv, err)
	}
	return string(stdout), string(stderr), exit
}

// sh runs a shell script in a sandbox, failing the test unless it exits 0.
func (p *corralProc) sh(id, script string) string {
	p.t.Helper()
	out, errOut, exit := p.run(id, "/bin/sh", "-c", script)
	if exit == nil || exit.Code != 0 {
		p.t.Fatalf("sh -c %q: exit %+v\nstdout: %s\nstderr: %s", script, exit, out, errOut)
	}
	return out
}

// cli runs the corral CLI binary against p and returns stdout, stderr and its exit code.
func (p *corralProc) cli(stdin string, args ...string) (string, string, int) {
	p.t.Helper()
	return p.cliIn("", stdin, args...)
}

// cliIn is cli run in the directory dir ("" for this process's).
func (p *corralProc) cliIn(dir, stdin string, args ...string) (string, string, int) {
	p.t.Helper()
	return p.cliAs(p.Token, dir, stdin, args...)
}

// cliAs is cliIn with another API token.
func (p *corralProc) cliAs(token, dir, stdin string, args ...string) (string, string, int) {
	p.t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "corral"), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CORRAL_URL="+p.URL, "CORRAL_TOKEN="+token)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		p.t.Fatalf("run corral %v: %v", args, err)
	}
	return out.String(), errOut.String(), code
}

// eventually polls cond until it holds or the deadline passes.
// waitEnded waits until sandbox id is no longer deleting (a delete answers before its host
// cleanup ends; the record then becomes stopped) and returns its record.
func waitEnded(t *testing.T, c *corral.Client, id string) *corral.Sandbox {
	t.Helper()
	var sb *corral.Sandbox
	eventually(t, time.Minute, "the cleanup of deleted sandbox "+id, func() bool {
		got, err := c.GetSandbox(context.Background(), id)
		sb = got
		return err == nil && got.State != corral.StateDeleting
	})
	return sb
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
