package agentrpc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Calls run for real only in a container (internal/runtime/runc's calls tests, with the real
// agent as PID 1); these tests cover what does not need one.

func TestValidCallID(t *testing.T) {
	tests := []struct {
		id   string
		want bool
	}{
		{"a", true},
		{"0123456789abcdef", true},
		{"call-1", true},
		{"-", true},
		{strings.Repeat("a", 64), true},
		{"", false},
		{strings.Repeat("a", 65), false},
		{"A", false},
		{"a_b", false},
		{"a.b", false},
		{".", false},
		{"..", false},
		{"a/b", false},
		{"a b", false},
		{"é", false},
		{"a\x00", false},
	}
	for _, tt := range tests {
		if got := validCallID(tt.id); got != tt.want {
			t.Errorf("validCallID(%q) = %v, want %v", tt.id, got, tt.want)
		}
	}
}

// TestSandboxCaps pins the set a call's command is dropped to: Docker's default set without
// NET_RAW, CAP_SYS_ADMIN in particular absent.
func TestSandboxCaps(t *testing.T) {
	const want = 1<<unix.CAP_CHOWN | 1<<unix.CAP_DAC_OVERRIDE | 1<<unix.CAP_FOWNER | 1<<unix.CAP_FSETID |
		1<<unix.CAP_KILL | 1<<unix.CAP_SETGID | 1<<unix.CAP_SETUID | 1<<unix.CAP_SETPCAP |
		1<<unix.CAP_NET_BIND_SERVICE | 1<<unix.CAP_SYS_CHROOT | 1<<unix.CAP_MKNOD | 1<<unix.CAP_AUDIT_WRITE |
		1<<unix.CAP_SETFCAP
	if got := sandboxCapMask(); got != want {
		t.Errorf("sandboxCapMask() = %#x, want %#x", got, want)
	}
	names := SandboxCaps()
	if len(names) != len(capNumbers) {
		t.Errorf("SandboxCaps() has %d names, capNumbers %d", len(names), len(capNumbers))
	}
	for _, n := range names {
		if _, ok := capNumbers[n]; !ok {
			t.Errorf("%s has no number", n)
		}
	}
	for _, bad := range []int{unix.CAP_SYS_ADMIN, unix.CAP_SYS_PTRACE, unix.CAP_SYS_MODULE, unix.CAP_NET_RAW, unix.CAP_SYS_RESOURCE} {
		if sandboxCapMask()&(1<<bad) != 0 {
			t.Errorf("capability %d in the sandbox's set", bad)
		}
	}
	names[0] = "changed"
	if SandboxCaps()[0] == "changed" {
		t.Errorf("SandboxCaps returns its own slice")
	}
	for _, p := range append(MaskedPaths(), ReadonlyPaths()...) {
		if !strings.HasPrefix(p, "/proc/") && !strings.HasPrefix(p, "/sys/") {
			t.Errorf("policy path %s is neither in /proc nor /sys", p)
		}
	}
}

// runFilter interprets the subset of classic BPF that callFilter emits over a seccomp_data.
func runFilter(t *testing.T, prog []unix.SockFilter, arch uint32, nr int, arg0 uint64) uint32 {
	t.Helper()
	data := make([]byte, 64)
	binary.LittleEndian.PutUint32(data[seccompDataNr:], uint32(nr))
	binary.LittleEndian.PutUint32(data[seccompDataArch:], arch)
	binary.LittleEndian.PutUint64(data[seccompDataArg0:], arg0)
	var acc uint32
	for pc := 0; pc < len(prog); pc++ {
		in := prog[pc]
		switch in.Code {
		case bpfLoadAbs:
			acc = binary.LittleEndian.Uint32(data[in.K:])
		case bpfJumpEqual, bpfJumpAtLeast, bpfJumpSet:
			var yes bool
			switch in.Code {
			case bpfJumpEqual:
				yes = acc == in.K
			case bpfJumpAtLeast:
				yes = acc >= in.K
			default:
				yes = acc&in.K != 0
			}
			if yes {
				pc += int(in.Jt)
			} else {
				pc += int(in.Jf)
			}
		case bpfReturn:
			return in.K
		default:
			t.Fatalf("instruction %d: code %#x not interpreted", pc, in.Code)
		}
	}
	t.Fatal("the filter fell off its end")
	return 0
}

// TestCallFilter runs the call's seccomp filter on the syscalls it must answer.
func TestCallFilter(t *testing.T) {
	arch := callAuditArch()
	if arch == 0 {
		t.Skipf("no call filter on this architecture")
	}
	prog := callFilter(arch)
	if len(prog) > 255 {
		t.Fatalf("filter of %d instructions", len(prog))
	}
	tests := []struct {
		name string
		nr   int
		arg0 uint64
		want uint32
	}{
		{"read", unix.SYS_READ, 0, unix.SECCOMP_RET_ALLOW},
		{"mount", unix.SYS_MOUNT, 0, seccompDenyEPERM},
		{"umount2", unix.SYS_UMOUNT2, 0, seccompDenyEPERM},
		{"unshare", unix.SYS_UNSHARE, unix.CLONE_NEWUSER, seccompDenyEPERM},
		{"setns", unix.SYS_SETNS, 0, seccompDenyEPERM},
		{"pivot_root", unix.SYS_PIVOT_ROOT, 0, seccompDenyEPERM},
		{"bpf", unix.SYS_BPF, 0, seccompDenyEPERM},
		{"open_tree", unix.SYS_OPEN_TREE, 0, seccompDenyEPERM},
		{"clone3", unix.SYS_CLONE3, 0, seccompNoSys},
		{"clone of a thread", unix.SYS_CLONE, unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD, unix.SECCOMP_RET_ALLOW},
		{"fork", unix.SYS_CLONE, uint64(unix.SIGCHLD), unix.SECCOMP_RET_ALLOW},
		{"clone into a user namespace", unix.SYS_CLONE, unix.CLONE_NEWUSER | uint64(unix.SIGCHLD), seccompDenyEPERM},
		{"clone into a pid namespace", unix.SYS_CLONE, unix.CLONE_NEWPID, seccompDenyEPERM},
		{"clone with flags in the high half", unix.SYS_CLONE, 1 << 40, unix.SECCOMP_RET_ALLOW},
	}
	for _, tt := range tests {
		if got := runFilter(t, prog, arch, tt.nr, tt.arg0); got != tt.want {
			t.Errorf("%s: %#x, want %#x", tt.name, got, tt.want)
		}
	}
	if got := runFilter(t, prog, arch^1, unix.SYS_READ, 0); got != unix.SECCOMP_RET_KILL_PROCESS {
		t.Errorf("another architecture: %#x, want kill", got)
	}
	if arch == unix.AUDIT_ARCH_X86_64 {
		if got := runFilter(t, prog, arch, x32SyscallBit|unix.SYS_READ, 0); got != unix.SECCOMP_RET_KILL_PROCESS {
			t.Errorf("x32 syscall: %#x, want kill", got)
		}
	}
}

// TestCallsRefused: a calls agent runs nothing but calls, any other agent no calls, and bad
// requests are refused before anything is mounted.
func TestCallsRefused(t *testing.T) {
	calls, _ := startServer(t, func(c *Config) { c.Calls = true; c.CallsDir = "/nonexistent/calls" })
	plain, _ := startServer(t, nil)
	ctx := testCtx(t)
	isInvalid := func(err error) bool { return errors.Is(err, errdefs.ErrInvalid) }
	isNotFound := func(err error) bool { return errors.Is(err, errdefs.ErrNotFound) }
	callIn := func(dir string) *CallSpec { return &CallSpec{Dir: dir} }
	tests := []struct {
		name string
		do   func() error
		want func(error) bool
	}{
		{"plain exec in a calls agent", func() error {
			_, err := calls.Exec(ctx, ExecRequest{Argv: []string{"true"}})
			return err
		}, isInvalid},
		{"plain start in a calls agent", func() error {
			_, err := calls.Start(ctx, ExecRequest{Argv: []string{"true"}})
			return err
		}, isInvalid},
		{"call in a plain agent", func() error {
			_, err := plain.Exec(ctx, ExecRequest{Argv: []string{"true"}, Call: callIn(DefaultCallsDir + "/a")})
			return err
		}, isInvalid},
		{"prep in a plain agent", func() error {
			_, err := plain.CallPrep(ctx, "a", 1<<20)
			return err
		}, isInvalid},
		{"end in a plain agent", func() error {
			_, err := plain.CallEnd(ctx, "a")
			return err
		}, isNotFound},
		{"bad id", func() error {
			_, err := calls.CallPrep(ctx, "A/../b", 1<<20)
			return err
		}, isInvalid},
		{"no size", func() error {
			_, err := calls.CallPrep(ctx, "a", 0)
			return err
		}, isInvalid},
		{"end of an unknown call", func() error {
			_, err := calls.CallEnd(ctx, "nosuch")
			return err
		}, isNotFound},
		{"end with a bad id", func() error {
			_, err := calls.CallEnd(ctx, "../x")
			return err
		}, isInvalid},
		{"call of an unknown id", func() error {
			_, err := calls.Exec(ctx, ExecRequest{Argv: []string{"true"}, Call: callIn("/nonexistent/calls/nosuch")})
			return err
		}, isNotFound},
		{"call outside the calls directory", func() error {
			_, err := calls.Exec(ctx, ExecRequest{Argv: []string{"true"}, Call: callIn("/tmp/x")})
			return err
		}, isInvalid},
		{"call with a terminal", func() error {
			_, err := calls.Exec(ctx, ExecRequest{Argv: []string{"true"}, TTY: true, Call: callIn("/nonexistent/calls/a")})
			return err
		}, isInvalid},
	}
	for _, tt := range tests {
		if err := tt.do(); !tt.want(err) {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
}

func TestConfigCallsDir(t *testing.T) {
	for _, d := range []string{"rel", "/", "/a/../b", "/a/"} {
		cfg := Config{CallsDir: d}
		if err := cfg.Validate(); errdefs.Field(err) != "calls_dir" {
			t.Errorf("CallsDir %q: %v, want invalid calls_dir", d, err)
		}
	}
}

// TestExecUsage: every command's exit reports its CPU time and peak memory.
func TestExecUsage(t *testing.T) {
	c, _ := startServer(t, nil)
	r := run(t, c, ExecRequest{Argv: []string{"i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done"}, Shell: true})
	if r.exit.Code != 0 || r.exit.CPUTime < 10*time.Millisecond || r.exit.MaxRSS < 100<<10 || r.exit.MaxRSS > 1<<30 {
		t.Errorf("exit = %+v, want a busy loop's usage", r.exit)
	}
	r = run(t, c, ExecRequest{Argv: []string{"/nonexistent"}})
	if r.exit.CPUTime != 0 || r.exit.MaxRSS != 0 {
		t.Errorf("a command that never ran reports usage: %+v", r.exit)
	}
}

// TestCallPrepEnd prepares and ends calls in a calls directory of the test's (the agent's real
// one is /.corral-calls): tmpfs mounted and gone, staged files, conflicts, and a mount nobody owns
// reported. No command runs: that needs a container.
func TestCallPrepEnd(t *testing.T) {
	needRoot(t, "mounts tmpfs")
	callsDir := filepath.Join(t.TempDir(), "calls")
	t.Cleanup(func() { unix.Unmount(callsDir, unix.MNT_DETACH) })
	c, _ := startServer(t, func(cfg *Config) { cfg.Calls = true; cfg.CallsDir = callsDir })
	ctx := testCtx(t)

	dir, err := c.CallPrep(ctx, "one", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if dir != callsDir+"/one" {
		t.Errorf("dir = %q", dir)
	}
	if st, err := os.Stat(callsDir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("calls dir: %v %v, want mode 0700", st.Mode(), err)
	}
	var root, upper unix.Stat_t
	unix.Stat("/", &root)
	unix.Stat(dir+"/upper", &upper)
	if upper.Mode != root.Mode || upper.Uid != root.Uid {
		t.Errorf("upper/ mode %o uid %d, want /'s %o %d", upper.Mode, upper.Uid, root.Mode, root.Uid)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC || fs.Blocks*uint64(fs.Bsize) != 1<<20 {
		t.Errorf("call dir is not a 1 MiB tmpfs: %+v %v", fs, err)
	}
	if _, err := c.WriteFile(ctx, dir+"/upper/work/in", strings.NewReader("input"), WriteOptions{Parents: true}); err != nil {
		t.Fatal(err)
	}
	// Beyond the size: the tmpfs is full.
	if _, err := c.WriteFile(ctx, dir+"/upper/big", io.LimitReader(zeros{}, 2<<20), WriteOptions{}); !errors.Is(err, errdefs.ErrExhausted) {
		t.Errorf("write beyond the call's size: %v, want exhausted", err)
	}
	if _, err := c.CallPrep(ctx, "one", 1<<20); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second prep: %v, want conflict", err)
	}
	ce, err := c.CallEnd(ctx, "one")
	if err != nil || !ce.Clean {
		t.Fatalf("CallEnd = %+v, %v", ce, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("call dir after the end: %v", err)
	}
	if _, err := c.CallEnd(ctx, "one"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second end: %v, want not found", err)
	}
	// The id is free again.
	if _, err := c.CallPrep(ctx, "one", 1<<20); err != nil {
		t.Fatal(err)
	}
	// What a call leaves in its layer is hostile: file operations do not follow its symbolic
	// links, and reach nothing under the calls directory but a prepared call's upper/.
	if _, err := c.WriteFile(ctx, dir+"/upper/secret", strings.NewReader("secret"), WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	other, err := c.CallPrep(ctx, "two", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"out": dir + "/upper/secret", "d": dir + "/upper", "rel": "../../one/upper/secret",
	} {
		if err := os.Symlink(target, other+"/upper/"+link); err != nil {
			t.Fatal(err)
		}
	}
	isDenied := func(err error) bool { return errors.Is(err, errdefs.ErrDenied) }
	isInvalid := func(err error) bool { return errors.Is(err, errdefs.ErrInvalid) }
	for _, tt := range []struct {
		name string
		do   func() error
		want func(error) bool
	}{
		{"read through a link", func() error { _, _, err := c.ReadFile(ctx, other+"/upper/out"); return err }, isDenied},
		{"read through a relative link", func() error { _, _, err := c.ReadFile(ctx, other+"/upper/rel"); return err }, isDenied},
		{"read below a linked directory", func() error { _, _, err := c.ReadFile(ctx, other+"/upper/d/secret"); return err }, isDenied},
		{"list a linked directory", func() error { _, err := c.List(ctx, other+"/upper/d"); return err }, isDenied},
		{"tar a linked directory", func() error { _, err := c.TarOut(ctx, other+"/upper/d"); return err }, isDenied},
		{"write below a linked directory", func() error {
			_, err := c.WriteFile(ctx, other+"/upper/d/x", strings.NewReader("x"), WriteOptions{})
			return err
		}, isDenied},
		{"the work directory", func() error { _, err := c.List(ctx, other+"/work"); return err }, isInvalid},
		{"the calls directory", func() error { _, err := c.List(ctx, callsDir); return err }, isInvalid},
		{"an unknown call", func() error { _, err := c.Stat(ctx, callsDir+"/nosuch/upper"); return err }, isInvalid},
		{"move below a linked directory", func() error { _, err := c.Move(ctx, other+"/upper/d/secret", other+"/upper/x"); return err }, isDenied},
		{"move into a linked directory", func() error { _, err := c.Move(ctx, other+"/upper/out", other+"/upper/d/x"); return err }, isDenied},
		{"move out of the call", func() error { _, err := c.Move(ctx, other+"/upper/out", other+"/work/x"); return err }, isInvalid},
		{"watch a linked directory", func() error { _, err := c.Watch(ctx, other+"/upper/d", false); return err }, isDenied},
	} {
		if err := tt.do(); !tt.want(err) {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
	if fi, err := c.Stat(ctx, other+"/upper/out"); err != nil || fi.Link != dir+"/upper/secret" {
		t.Errorf("Stat of a link = %+v, %v; want the link itself", fi, err)
	}
	if err := c.Remove(ctx, other+"/upper/out", false); err != nil {
		t.Errorf("Remove of a link: %v", err)
	}
	if ce, err := c.CallEnd(ctx, "two"); err != nil || !ce.Clean {
		t.Fatalf("CallEnd(two) = %+v, %v", ce, err)
	}

	// A mount under the calls directory that no call owns makes the end unclean, and is detached.
	stray := filepath.Join(callsDir, "stray")
	if err := os.Mkdir(stray, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("x", stray, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	ce, err = c.CallEnd(ctx, "one")
	if err != nil || ce.Clean || len(ce.Problems) != 1 || !strings.Contains(ce.Problems[0], "mount left at "+stray) {
		t.Errorf("CallEnd with a stray mount = %+v, %v", ce, err)
	}
	if mountedUnder(t, callsDir+"/") {
		t.Errorf("mounts left under %s", callsDir)
	}

	// Calls are independent: many at once.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			id := fmt.Sprintf("c-%d", i)
			for range 5 {
				if _, err := c.CallPrep(ctx, id, 1<<20); err != nil {
					t.Error(err)
					return
				}
				if ce, err := c.CallEnd(ctx, id); err != nil || !ce.Clean {
					t.Errorf("CallEnd(%s) = %+v, %v", id, ce, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if mountedUnder(t, callsDir+"/") {
		t.Errorf("mounts left under %s", callsDir)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func mountedUnder(t *testing.T, prefix string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(strings.Split(string(b), "\n"), func(l string) bool {
		f := strings.Fields(l)
		return len(f) > 4 && strings.HasPrefix(f[4], prefix)
	})
}

func TestBoundEtcFiles(t *testing.T) {
	p := filepath.Join(t.TempDir(), "mountinfo")
	os.WriteFile(p, []byte(`22 1 0:21 / / rw - overlay overlay rw
23 22 0:22 / /proc rw - proc proc rw
30 22 254:1 /resolv /etc/resolv.conf ro - ext4 /dev/vda1 rw
31 22 254:1 /h /etc/hosts ro - ext4 /dev/vda1 rw
32 22 254:1 /x /etc/passwd ro - ext4 /dev/vda1 rw
`), 0o644)
	if got, want := boundEtcFiles(p), []string{"/etc/resolv.conf", "/etc/hosts"}; !slices.Equal(got, want) {
		t.Errorf("boundEtcFiles = %q, want %q", got, want)
	}
}

func TestProcFUSEFiles(t *testing.T) {
	p := filepath.Join(t.TempDir(), "mountinfo")
	os.WriteFile(p, []byte(`22 1 0:21 / / rw - overlay overlay rw
23 22 0:22 / /proc rw - proc proc rw
40 23 0:50 /proc/cpuinfo /proc/cpuinfo rw - fuse.lxcfs lxcfs rw
41 23 0:50 /proc/swaps /proc/swaps rw - fuse.lxcfs lxcfs rw
42 23 0:50 /x /proc/odd\040name rw - fuse.lxcfs lxcfs rw
43 23 0:51 /k /proc/kcore ro - tmpfs tmpfs ro
44 22 0:50 /proc/uptime /etc/uptime rw - fuse.lxcfs lxcfs rw
`), 0o644)
	if got, want := procFUSEFiles(p), []string{"/proc/cpuinfo", "/proc/swaps"}; !slices.Equal(got, want) {
		t.Errorf("procFUSEFiles = %q, want %q", got, want)
	}
}
