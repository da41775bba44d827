package runc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/mountinfo"
	"github.com/corral-dev/corral/internal/runtime"
)

var capNumbers = map[string]uint{
	"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_FOWNER": 3, "CAP_FSETID": 4, "CAP_KILL": 5,
	"CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SETPCAP": 8, "CAP_NET_BIND_SERVICE": 10,
	"CAP_SYS_CHROOT": 18, "CAP_MKNOD": 27, "CAP_AUDIT_WRITE": 29, "CAP_SETFCAP": 31,
}

// TestSandboxInside checks, from inside a sandbox, everything the spec promises.
// TestSandboxInside checks a sandbox from inside, started by either engine.
func TestSandboxInside(t *testing.T) {
	t.Run("corral-runcd", func(t *testing.T) { sandboxInside(t, true) })
	t.Run("runc run --detach", func(t *testing.T) { sandboxInside(t, false) })
}

func sandboxInside(t *testing.T, runcd bool) {
	e := newTestEnv(t, func(c *Config) {
		c.Runcd = ""
		if runcd {
			c.Runcd = fx.runcd
		}
	})
	if (e.r.engine != nil) != runcd {
		t.Fatalf("engine %v, want corral-runcd %v", e.r.engine, runcd)
	}
	s := e.spec("inside-1")
	s.Hostname = "box"
	s.DiskBytes = 32 << 20 // not the pool size: exercises the on-demand disk
	s.Pids = 40
	s.OpenFiles = 4242
	s.MemoryBytes = 256 << 20
	s.CPUs = 0.5
	s.Env = []string{"GREETING=hi"}
	agentSum := fileSum(t, fx.agent)
	sb := e.create(s)
	sock := sb.AgentSocket

	if st, err := os.Stat(sb.Dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("state dir mode: %v %v, want 0700", st.Mode(), err)
	}
	wantCaps := uint64(0)
	for _, c := range defaultCaps {
		wantCaps |= 1 << capNumbers[c]
	}

	checks := []struct {
		name, cmd, want string
	}{
		{"upper layer wins", "cat /etc/corral-layer", "top"},
		{"lower layer visible", "cat /etc/only-base", "yes"},
		{"hostname", "hostname", "box"},
		{"env", "echo $GREETING", "hi"},
		{"uid", "id -u", "0"},
		{"seccomp filter", "grep ^Seccomp: /proc/self/status | tr -d '\\t '", "Seccomp:2"},
		{"no_new_privs", "grep ^NoNewPrivs: /proc/self/status | tr -d '\\t '", "NoNewPrivs:1"},
		{"capabilities", "grep ^CapEff: /proc/self/status | tr -d '\\t '", fmt.Sprintf("CapEff:%016x", wantCaps)},
		{"bounding set", "grep ^CapBnd: /proc/self/status | tr -d '\\t '", fmt.Sprintf("CapBnd:%016x", wantCaps)},
		{"nofile limit", "ulimit -n", "4242"},
		{"only loopback", "ls /sys/class/net", "lo"},
		{"loopback up", "cat /sys/class/net/lo/operstate", "unknown"},
		// A masked file reads empty; some do not exist on every kernel (no CONFIG_PROC_KCORE).
		{"kcore masked", "cat /proc/kcore 2>/dev/null | wc -c", "0"},
		{"keys masked", "cat /proc/keys 2>/dev/null | wc -c", "0"},
		{"timer_list masked", "cat /proc/timer_list 2>/dev/null | wc -c", "0"},
		{"sched_debug masked", "cat /proc/sched_debug 2>/dev/null | wc -c", "0"},
		{"kpageflags masked", "cat /proc/kpageflags 2>/dev/null | wc -c", "0"},
		{"kpagecount masked", "cat /proc/kpagecount 2>/dev/null | wc -c", "0"},
		{"kpagecgroup masked", "cat /proc/kpagecgroup 2>/dev/null | wc -c", "0"},
		{"sysrq-trigger masked", "(echo h > /proc/sysrq-trigger) 2>/dev/null; cat /proc/sysrq-trigger 2>/dev/null | wc -c", "0"},
		{"firmware masked", "ls -A /sys/firmware | wc -l", "0"},
		{"powercap masked", "ls -A /sys/devices/virtual/powercap 2>/dev/null | wc -l", "0"},
		{"acpi masked", "ls -A /proc/acpi 2>/dev/null | wc -l", "0"},
		{"proc/sys read-only", "echo 1 2>/dev/null > /proc/sys/kernel/panic; echo $?", "1"},
		{"sys read-only", "touch /sys/x 2>/dev/null; echo $?", "1"},
		{"devices", "ls /dev | grep -v -x -e core -e fd -e full -e mqueue -e null -e ptmx -e pts -e random -e shm -e stderr -e stdin -e stdout -e tty -e urandom -e zero | wc -l", "0"},
		{"device nodes", "ls -l /dev | grep ^c | wc -l", "6"}, // null zero full tty random urandom
		{"shm size", "df -k /dev/shm | tail -1 | awk '{print $2}'", strconv.Itoa(int(testShmBytes >> 10))},
		{"agent is pid 1", "cat /proc/1/comm", "4"},
		{"agent's /proc is closed", "readlink /proc/1/exe || readlink /proc/1/fd/3 || cat /proc/1/environ 2>/dev/null; echo $?", "1"},
		{"agent not ptraceable", "cat /proc/1/mem 2>/dev/null; echo $?", "1"},
		{"children oom_score_adj", "cat /proc/self/oom_score_adj", "0"},
		{"socket fd not inherited", "for f in /proc/$$/fd/*; do readlink $f; done | grep -c -e socket: -e memfd:", "0"},
		{"no mount syscall", "mount -t tmpfs x /mnt 2>/dev/null; echo $?", "1"},
		{"no unshare", "unshare -U true 2>/dev/null; echo $?", "1"},
		{"no raw sockets", "ping -c1 127.0.0.1 >/dev/null 2>&1; echo $?", "1"},
		{"exec from the writable layer", "cp /bin/busybox /tmp/echo && /tmp/echo ok", "ok"},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			res := sh(t, sock, c.cmd)
			if got := strings.TrimSpace(res.Out); got != c.want {
				t.Errorf("%s: got %q (exit %d), want %q", c.cmd, got, res.Code, c.want)
			}
		})
	}

	t.Run("agent binary is not writable", func(t *testing.T) {
		for _, cmd := range []string{
			"echo x >> /proc/1/exe", "echo x > /proc/1/exe", "truncate -s 0 /proc/1/exe",
			"chmod 777 /proc/1/exe", "cp /bin/busybox /proc/1/exe",
		} {
			if res := sh(t, sock, cmd+" 2>&1"); res.Code == 0 {
				t.Errorf("%s succeeded: %s", cmd, res.Out)
			}
		}
		// Even a host root holding the memfd cannot write it: it is sealed.
		exe := fmt.Sprintf("/proc/%d/exe", sb.Pid)
		if target, _ := os.Readlink(exe); target != "/memfd:corral-agent (deleted)" {
			t.Errorf("agent runs from %q, want the memfd", target)
		}
		f, err := os.Open(exe)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
		if want := unix.F_SEAL_SEAL | unix.F_SEAL_WRITE | unix.F_SEAL_GROW | unix.F_SEAL_SHRINK; err != nil || seals&want != want {
			t.Errorf("agent memfd seals = %#x %v, want at least %#x", seals, err, want)
		}
		if w, err := os.OpenFile(exe, os.O_WRONLY, 0); err == nil {
			_, err = w.Write([]byte("x"))
			w.Close()
			if err == nil {
				t.Errorf("host root wrote to the agent memfd")
			}
		}
		if got := fileSum(t, fx.agent); got != agentSum {
			t.Errorf("agent binary on the host changed")
		}
		if res := sh(t, sock, "ls /proc/self/fd/4 2>&1"); res.Code == 0 {
			t.Errorf("fd 4 reachable from a child: %s", res.Out)
		}
	})

	t.Run("no host mounts", func(t *testing.T) {
		out := okSh(t, sock, "cut -d' ' -f5 /proc/self/mountinfo | sort -u | tr '\\n' ' '")
		for _, mp := range strings.Fields(out) {
			ok := mp == "/" || mp == "/proc" || mp == "/sys" || mp == "/dev" || mp == "/etc/hosts" || strings.HasPrefix(mp, "/dev/") ||
				strings.HasPrefix(mp, "/proc/") || strings.HasPrefix(mp, "/sys/")
			if !ok {
				t.Errorf("unexpected mount %s in the sandbox", mp)
			}
		}
	})

	t.Run("etc hosts", func(t *testing.T) {
		// Debian's order: IPv4 localhost first, then ::1 (agentrpc.HostsFile says why the
		// sandbox's own name is not there).
		want := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback"
		if got := okSh(t, sock, "grep -v '^#' /etc/hosts"); got != want {
			t.Errorf("/etc/hosts: %q, want %q", got, want)
		}
		// Root inside may add entries, as in Docker; the tmpfs bounds how far the file grows.
		if got := okSh(t, sock, "echo '10.9.8.7\tadded.example' >> /etc/hosts && tail -n1 /etc/hosts"); got != "10.9.8.7\tadded.example" {
			t.Errorf("an appended entry: %q", got)
		}
		if res := sh(t, sock, "head -c 200000 /dev/zero >> /etc/hosts"); res.Code == 0 {
			t.Errorf("/etc/hosts grew by 200 kB: its tmpfs does not bound it")
		}
		// Its mount names no host path (the file is on a tmpfs of the sandbox's own).
		if mi := okSh(t, sock, "grep ' /etc/hosts ' /proc/self/mountinfo | cut -d' ' -f4"); strings.TrimSpace(mi) != "/hosts" {
			t.Errorf("/etc/hosts is mounted from %q", mi)
		}
	})

	t.Run("agent oom_score_adj", func(t *testing.T) {
		want := "-1000"
		if !canLowerOOMScore() {
			want = strings.TrimSpace(readTrim(t, "/proc/self/oom_score_adj"))
			t.Logf("no CAP_SYS_RESOURCE here: the agent inherits oom_score_adj %s", want)
		}
		if got := readTrim(t, fmt.Sprintf("/proc/%d/oom_score_adj", sb.Pid)); got != want {
			t.Errorf("agent oom_score_adj = %s, want %s", got, want)
		}
	})

	t.Run("pids limit", func(t *testing.T) {
		res := sh(t, sock, "for i in $(seq 60); do sleep 1 & done 2>&1; wait")
		if !strings.Contains(res.Out, "can't fork") && !strings.Contains(res.Out, "Resource temporarily unavailable") {
			t.Errorf("60 processes under pids=40 were allowed: exit %d %q", res.Code, res.Out)
		}
		if got := readTrim(t, filepath.Join(e.r.cg.Dir("pids", s.ID), "pids.max")); got != "40" {
			t.Errorf("pids.max = %s, want 40", got)
		}
		// The shell gives up at the first failed fork; let its orphans finish.
		deadline := time.Now().Add(10 * time.Second)
		for procs, _ := e.r.cg.Procs(s.ID); len(procs) > 1; procs, _ = e.r.cg.Procs(s.ID) {
			if time.Now().After(deadline) {
				t.Fatalf("processes left: %v", procs)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})

	t.Run("cgroups", func(t *testing.T) {
		for c, want := range map[string]map[string]string{
			"memory":  {"memory.limit_in_bytes": "268435456", "memory.memsw.limit_in_bytes": "268435456"},
			"cpu":     {"cpu.cfs_quota_us": "50000", "cpu.cfs_period_us": "100000"},
			"freezer": {"freezer.state": "THAWED"},
		} {
			for file, v := range want {
				p := filepath.Join(e.r.cg.Dir(c, s.ID), file)
				if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) && file == "memory.memsw.limit_in_bytes" {
					continue // no swap accounting on this kernel
				}
				if got := readTrim(t, p); got != v {
					t.Errorf("%s = %s, want %s", p, got, v)
				}
			}
		}
	})

	t.Run("disk limit", func(t *testing.T) {
		res := sh(t, sock, "dd if=/dev/zero of=/big bs=1M count=64 2>&1")
		if res.Code == 0 || !strings.Contains(res.Out, "No space left on device") {
			t.Errorf("writing 64 MiB on a 32 MiB disk: exit %d, %q", res.Code, res.Out)
		}
		okSh(t, sock, "rm /big")
		if out := okSh(t, sock, "echo still > /after && cat /after"); out != "still" {
			t.Errorf("disk not writable after freeing space: %q", out)
		}
	})

	t.Run("status", func(t *testing.T) {
		st, err := e.r.Status(context.Background(), s.ID)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != runtime.StateRunning || st.Pid != sb.Pid || st.MemoryBytes == 0 {
			t.Errorf("Status = %+v, want running with pid %d and some memory", st, sb.Pid)
		}
	})

	t.Run("container is detached from the caller", func(t *testing.T) {
		stat := procStat(t, sb.Pid)
		if stat.ppid == os.Getpid() || stat.sid == getsid() || stat.pgrp == unix.Getpgrp() {
			t.Errorf("init %d: ppid %d sid %d pgrp %d; caller pid %d sid %d pgrp %d",
				sb.Pid, stat.ppid, stat.sid, stat.pgrp, os.Getpid(), getsid(), unix.Getpgrp())
		}
	})
}

// TestDumpableAgentIsExposed shows why the agent must make itself non-dumpable: otherwise root
// inside reaches its control socket and binary through /proc/1. The binary stays unwritable.
func TestDumpableAgentIsExposed(t *testing.T) {
	e := newTestEnv(t, nil)
	s := e.spec("dumpable")
	s.AgentArgs = []string{"serve", "--dumpable"}
	sb := e.create(s)
	if got := okSh(t, sb.AgentSocket, "readlink /proc/1/fd/3"); !strings.HasPrefix(got, "socket:") {
		t.Errorf("readlink /proc/1/fd/3 = %q; if this is no longer reachable, update the package doc", got)
	}
	if got := okSh(t, sb.AgentSocket, "readlink /proc/1/exe"); got != "/memfd:corral-agent (deleted)" {
		t.Errorf("readlink /proc/1/exe = %q, want the memfd", got)
	}
	for _, cmd := range []string{"echo x >> /proc/1/exe", "echo x > /proc/1/exe", "truncate -s 0 /proc/1/exe", "chmod 0 /proc/1/exe"} {
		if res := sh(t, sb.AgentSocket, cmd+" 2>&1"); res.Code == 0 {
			t.Errorf("%s succeeded on the sealed agent binary: %s", cmd, res.Out)
		}
	}
	if got := okSh(t, sb.AgentSocket, "cmp /proc/1/exe /proc/1/exe && wc -c < /proc/1/exe"); got != strconv.FormatInt(fileSize(t, fx.agent), 10) {
		t.Errorf("agent binary size inside = %s", got)
	}
}

func fileSize(t testing.TB, p string) int64 {
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// TestOOMThenStopped checks that an OOM kill is counted and that a sandbox whose agent died
// while nobody watched reads as stopped, OOM count kept.
func TestOOMThenStopped(t *testing.T) {
	e := newTestEnv(t, nil)
	s := e.spec("oom")
	s.MemoryBytes = 32 << 20
	sb := e.create(s)
	res := sh(t, sb.AgentSocket, "dd if=/dev/zero of=/dev/null bs=64M count=1 2>&1")
	if res.Code == 0 {
		t.Fatalf("allocating 64 MiB under a 32 MiB limit succeeded: %s", res.Out)
	}
	st, err := e.r.Status(context.Background(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != runtime.StateRunning || st.OOMKills == 0 {
		t.Fatalf("after the OOM kill of a child: %+v, want running with OOMKills > 0", st)
	}
	// The next Status of the running sandbox polls a pidfd of its init (liveInits).
	if pid, ok := e.r.inits.alive(s.ID); !ok || pid != sb.Pid {
		t.Fatalf("no pidfd of the running init held (%d %v, want %d)", pid, ok, sb.Pid)
	}
	if err := unix.Kill(sb.Pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool {
		st, err = e.r.Status(context.Background(), s.ID)
		return err == nil && st.State == runtime.StateStopped
	})
	if st.OOMKills == 0 || st.Pid != 0 {
		t.Errorf("stopped status = %+v, want OOMKills kept and no pid", st)
	}
	if err := e.r.Delete(context.Background(), s.ID); err != nil {
		t.Fatal(err)
	}
	e.r.inits.mu.Lock()
	_, held := e.r.inits.m[s.ID]
	e.r.inits.mu.Unlock()
	if held {
		t.Error("a pidfd of the deleted sandbox's init is still held")
	}
	if _, err := e.r.Status(context.Background(), s.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Status after Delete: %v, want not found", err)
	}
	if err := e.r.Delete(context.Background(), s.ID); err != nil {
		t.Errorf("second Delete: %v", err)
	}
}

func TestCreateErrors(t *testing.T) {
	e := newTestEnv(t, nil)
	ctx := context.Background()
	sb := e.create(e.spec("dup"))

	t.Run("conflict", func(t *testing.T) {
		if _, err := e.r.Create(ctx, runtime.Spec(e.spec("dup"))); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("second Create: %v, want conflict", err)
		}
		okSh(t, sb.AgentSocket, "true") // the first is untouched
	})
	t.Run("runc fails", func(t *testing.T) {
		broken := filepath.Join(e.top, "broken")
		os.MkdirAll(broken, 0o755)
		os.WriteFile(filepath.Join(broken, "proc"), nil, 0o644) // runc cannot mount /proc on a file
		s := e.spec("runc-fails")
		s.Lower = append(s.Lower, broken)
		_, err := e.r.Create(ctx, runtime.Spec(s))
		if err == nil || !strings.Contains(err.Error(), "runc run") || !strings.Contains(err.Error(), "proc") {
			t.Fatalf("Create over a layer with /proc a file: %v, want runc's error", err)
		}
		t.Logf("error as the caller sees it: %v", err)
		if ids, _ := e.r.List(ctx); len(ids) != 1 {
			t.Errorf("after a failed Create, List = %v, want only dup", ids)
		}
		// runc was Create's last step: what every step before it took is given back (the
		// environment's teardown checks the rest: mounts, loop devices, cgroups, processes).
		if _, err := os.Lstat(e.r.dir(s.ID)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the failed sandbox's directory: %v, want it gone", err)
		}
		if e.r.slots != nil {
			if slot, ok := e.r.slots.slotOf(s.ID); ok {
				t.Errorf("the failed sandbox still holds user namespace slot %d", slot)
			}
		}
	})
	t.Run("agent that cannot exec", func(t *testing.T) {
		// runc reports nothing that happens after the agent's exec begins: such a sandbox is
		// created, and then reads as stopped with a refused socket.
		bad := filepath.Join(e.top, "not-elf")
		os.WriteFile(bad, []byte("not a program\n"), 0o755)
		s := e.spec("bad-agent")
		s.AgentPath = bad
		sb, err := e.r.Create(ctx, runtime.Spec(s))
		if e.r.UserNS() != nil && e.r.nsHelper == "" {
			// With user namespaces made by the agent's helper (no corral-runcd), the agent's
			// binary also runs on the host first: the Create fails there, leaving nothing.
			if err == nil || !strings.Contains(err.Error(), "user namespace helper") {
				t.Fatalf("Create with a non-program agent: %v, want the helper's exec error", err)
			}
			if ids, _ := e.r.List(ctx); len(ids) != 1 {
				t.Errorf("after a failed Create, List = %v, want only dup", ids)
			}
			return
		}
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		waitFor(t, 5*time.Second, func() bool {
			st, err := e.r.Status(ctx, s.ID)
			return err == nil && st.State == runtime.StateStopped
		})
		if _, err := trySh(sb.AgentSocket, "true"); !errors.Is(err, unix.ECONNREFUSED) {
			t.Errorf("connect to a dead agent: %v, want connection refused", err)
		}
		if err := e.r.Delete(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("invalid", func(t *testing.T) {
		for _, s := range []Spec{
			{ID: "", Lower: []string{fx.base}, AgentPath: fx.agent},
			{ID: "a/b", Lower: []string{fx.base}, AgentPath: fx.agent},
			{ID: "ok", AgentPath: fx.agent},
			{ID: "ok", Lower: []string{"relative"}, AgentPath: fx.agent},
			{ID: "ok", Lower: []string{fx.base}, AgentPath: "/nonexistent"},
		} {
			if _, err := e.r.Create(ctx, runtime.Spec(resolved(s))); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("Create(%+v): %v, want invalid", s, err)
			}
		}
		// A limit admission did not resolve is the caller's bug: an error, not a default.
		s := Spec{ID: "ok", Lower: []string{fx.base}, AgentPath: fx.agent, DiskBytes: 1 << 20}
		if _, err := e.r.Create(ctx, runtime.Spec(s)); err == nil || errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Create(%+v): %v, want an internal error", s, err)
		}
	})
}

func TestSocketPathTooLong(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.StateDir = filepath.Join(filepath.Dir(c.StateDir), strings.Repeat("d", 40), "s") })
	ok := strings.Repeat("k", 107-len(e.cfg.StateDir+"//agent.sock"))
	if _, err := e.r.Create(context.Background(), runtime.Spec(e.spec(ok+"x"))); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "unix socket limit") {
		t.Fatalf("Create with a socket path of 108 bytes: %v", err)
	}
	sb := e.create(e.spec(ok))
	if len(sb.AgentSocket) != 107 {
		t.Fatalf("socket path %d bytes, want 107", len(sb.AgentSocket))
	}
	okSh(t, sb.AgentSocket, "true")
	if err := (Config{StateDir: "/" + strings.Repeat("d", 94)}).Validate(); errdefs.Field(err) != "StateDir" {
		t.Errorf("Validate with a 95-byte StateDir: %v, want a StateDir error", err)
	}
}

// TestPartialState checks that Delete cleans up after a caller that crashed mid-Create.
func TestPartialState(t *testing.T) {
	e := newTestEnv(t, nil)
	ctx := context.Background()

	// A disk claimed and an overlay mounted, then the caller died.
	slot, err := e.r.makeSlot(ctx, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	dir := e.r.dir("half")
	if err := os.Rename(slot, dir); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(dir, "rootfs"), 0o755)
	if err := mountOverlay(filepath.Join(dir, "rootfs"), []string{fx.base}, filepath.Join(dir, "disk/upper"), filepath.Join(dir, "disk/work"), nil); err != nil {
		t.Fatal(err)
	}
	// runc got as far as `runc create`: its init waits on the exec fifo, never started.
	hs := e.spec("half")
	if err := hs.normalize(e.r.maxOpenFiles); err != nil {
		t.Fatal(err)
	}
	cfg, err := e.r.tmpl.render(&hs, e.r.cgroupPath("half"), nil, nil, nil, Budgets{})
	if err != nil {
		t.Fatal(err)
	}
	cfg = bytes.Replace(cfg, []byte(`"/proc/self/fd/4","serve"`), []byte(`"/bin/sleep","100"`), 1)
	os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o600)
	// Not CombinedOutput: the waiting init would hold the pipe open, and the test with it.
	outf, _ := os.CreateTemp(e.top, "runc-create-out")
	cmd := exec.Command(e.cfg.Runc, "--root", e.cfg.RuncRoot, "create", "--bundle", dir, "half")
	cmd.Stdout, cmd.Stderr = outf, outf
	if err := cmd.Run(); err != nil {
		out, _ := os.ReadFile(outf.Name())
		t.Fatalf("runc create: %v: %s", err, out)
	}
	outf.Close()
	if procs, _ := e.r.cg.Procs("half"); len(procs) != 1 {
		t.Fatalf("runc create left %d processes, want its waiting init", len(procs))
	}
	// A cgroup made by runc, with no runc state.
	for _, d := range e.r.cg.Dirs("orphan-cg") {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// runc state whose container is gone: a sandbox killed, then its directory lost.
	sb := e.create(e.spec("lost"))
	unix.Kill(sb.Pid, unix.SIGKILL)

	ids, err := e.r.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(ids, ","); got != "half,lost,orphan-cg" {
		t.Errorf("List = %s, want half,lost,orphan-cg", got)
	}
	if _, err := e.r.Open(ctx, "half"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Open(half): %v, want not found", err)
	}
	for _, id := range ids {
		if err := e.r.Delete(ctx, id); err != nil {
			t.Errorf("Delete(%s): %v", id, err)
		}
	}
	if ids, _ := e.r.List(ctx); len(ids) != 0 {
		t.Errorf("List after Delete = %v", ids)
	}
}

// TestManyCreateDelete churns sandboxes, some concurrently, and relies on the env's teardown to
// find anything left on the host.
func TestManyCreateDelete(t *testing.T) {
	e := newTestEnv(t, nil)
	ctx := context.Background()
	n := 24
	if testing.Short() {
		n = 6
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 3 {
				s := e.spec(fmt.Sprintf("churn-%d", i))
				if i%4 == 0 {
					s.DiskBytes = 24 << 20
				}
				sb, err := e.r.Create(ctx, runtime.Spec(s))
				if err != nil {
					errs <- err
					continue
				}
				if res, err := trySh(sb.AgentSocket, "echo hi > /f && cat /f"); err != nil || strings.TrimSpace(res.Out) != "hi" {
					errs <- fmt.Errorf("%s: %v %+v", s.ID, err, res)
				}
				if i%5 == 0 {
					unix.Kill(sb.Pid, unix.SIGKILL) // some die before Delete
				}
				if err := e.r.Delete(ctx, s.ID); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if ids, _ := e.r.List(ctx); len(ids) != 0 {
		t.Errorf("List after churn = %v", ids)
	}
	if leaks := e.leaksWhileOpen(); len(leaks) > 0 {
		t.Errorf("leaks: %v", leaks)
	}
}

// leaksWhileOpen is leaks() minus what a live runtime legitimately holds: its pool.
func (e *testEnv) leaksWhileOpen() []string {
	var out []string
	for _, l := range e.leaks() {
		if !strings.Contains(l, ".pool") && !strings.HasPrefix(l, "loop devices") && !strings.HasPrefix(l, "mounts under StateDir") {
			out = append(out, l)
		}
	}
	mps, _ := mountinfo.Under(e.cfg.StateDir)
	for _, mp := range mps {
		if !strings.HasPrefix(mp, e.r.poolDir+"/") {
			out = append(out, "mount "+mp)
		}
	}
	pool := loopsBackedUnder(e.r.poolDir, nil)
	for _, dev := range loopsBackedUnder(e.cfg.StateDir, nil) {
		if !slices.Contains(pool, dev) {
			out = append(out, "loop device "+dev)
		}
	}
	return out
}

// TestLayerOrderMany stacks several layers and checks the topmost copy of a file wins.
func TestLayerOrderMany(t *testing.T) {
	e := newTestEnv(t, nil)
	var layers []string
	for i := range 5 {
		d := filepath.Join(e.top, fmt.Sprintf("l%d", i))
		os.MkdirAll(filepath.Join(d, "etc"), 0o755)
		os.WriteFile(filepath.Join(d, "etc/who"), []byte(strconv.Itoa(i)), 0o644)
		os.WriteFile(filepath.Join(d, fmt.Sprintf("etc/only-%d", i)), nil, 0o644)
		layers = append(layers, d)
	}
	s := e.spec("layers")
	s.Lower = append([]string{fx.base}, layers...)
	sb := e.create(s)
	if got := okSh(t, sb.AgentSocket, "cat /etc/who"); got != "4" {
		t.Errorf("/etc/who = %s, want 4 (the last layer)", got)
	}
	if got := okSh(t, sb.AgentSocket, "ls /etc | grep -c 'only-[0-9]'"); got != "5" {
		t.Errorf("files from every layer: %s, want 5", got)
	}
}

func fileSum(t testing.TB, p string) [32]byte {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func readTrim(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Errorf("read %s: %v", p, err)
	}
	return string(bytes.TrimSpace(b))
}

type pstat struct{ ppid, pgrp, sid int }

func procStat(t testing.TB, pid int) pstat {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	return pstat{ppid: atoi(f[1]), pgrp: atoi(f[2]), sid: atoi(f[3])}
}

func waitFor(t testing.TB, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func getsid() int { sid, _ := unix.Getsid(0); return sid }
