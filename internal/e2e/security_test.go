package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/corral-dev/corral/internal/lxcfs"
	corral "github.com/corral-dev/corral/sdk/go"
)

// TestHarnessUnreachable proves from inside a sandbox, as root, that nothing of the harness can be
// reached: the agent's channel, binary, memory, environment and descriptors, and that overwriting
// the sandbox's shell changes nothing for the agent.
func TestHarnessUnreachable(t *testing.T) {
	p := withBase(t)
	sb := p.create(corral.CreateRequest{})

	checks := []struct {
		name, script, want string
	}{
		{"runs as root", "id -u", "0"},
		{"no socket file anywhere", "find / -xdev -type s 2>/dev/null | wc -l", "0"},
		{"no unix socket in the sandbox's network namespace", "tail -n +2 /proc/net/unix | wc -l", "0"},
		{"agent memory unreadable", "cat /proc/1/mem >/dev/null 2>&1 && echo readable || echo denied", "denied"},
		{"agent environment unreadable", "cat /proc/1/environ >/dev/null 2>&1 && echo readable || echo denied", "denied"},
		{"agent descriptors unopenable", "for f in /proc/1/fd/*; do cat $f >/dev/null 2>&1 </dev/null && echo open $f; done; echo end", "end"},
		{"agent descriptor links unreadable", "readlink /proc/1/fd/3 2>/dev/null || echo denied", "denied"},
		{"agent binary unreadable", "cat /proc/1/exe >/dev/null 2>&1 && echo readable || echo denied", "denied"},
		{"agent binary not in the filesystem", "find / -xdev -name 'corral*' 2>/dev/null | wc -l", "0"},
		{"no harness mounts", "grep -c -e agent.sock -e corral-agent -e /proc/self/fd /proc/self/mountinfo || true", "0"},
		{"agent cannot be killed", "kill -9 1; kill -SEGV 1; kill -TERM 1; sleep 0.2; echo alive", "alive"},
		{"no ptrace capability", "grep CapEff /proc/self/status | awk '{print $2}'", ""},
		{"seccomp filter on", "grep Seccomp: /proc/self/status | awk '{print $2}'", "2"},
		{"no new privileges", "grep NoNewPrivs /proc/self/status | awk '{print $2}'", "1"},
		{"kcore masked", "head -c 16 /proc/kcore 2>/dev/null | wc -c", "0"},
		{"kpagecgroup masked", "head -c 16 /proc/kpagecgroup 2>/dev/null | wc -c", "0"},
		{"keys masked", "cat /proc/keys 2>/dev/null | wc -c", "0"},
		{"sysrq-trigger not writable", "echo h > /proc/sysrq-trigger 2>/dev/null && echo wrote || echo refused", "refused"},
		{"/proc/sys read-only", "echo 1 > /proc/sys/kernel/panic 2>/dev/null && echo wrote || echo refused", "refused"},
		{"/sys read-only", "touch /sys/x 2>/dev/null && echo wrote || echo refused", "refused"},
		{"cannot remount", "mount -o remount,rw /proc/sys 2>/dev/null && echo remounted || echo refused", "refused"},
		{"no network but loopback", "ls /sys/class/net | tr '\\n' ' '", "lo"},
		{"no agent log files", "find /tmp /var /run /root -type f 2>/dev/null | wc -l", "0"},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			out, errOut, exit := p.run(sb.ID, "/bin/sh", "-c", c.script)
			if exit.Code != 0 {
				t.Fatalf("sh -c %q: exit %+v, stderr %q", c.script, exit, errOut)
			}
			got := strings.TrimSpace(out)
			if c.name == "no ptrace capability" {
				// CapEff is hex; bit 19 is CAP_SYS_PTRACE, 21 CAP_SYS_ADMIN, 16 CAP_SYS_MODULE, 13 CAP_NET_RAW.
				var caps uint64
				fmt.Sscanf(got, "%x", &caps)
				for _, bit := range []uint{13, 16, 19, 21} {
					if caps&(1<<bit) != 0 {
						t.Fatalf("CapEff %s has capability bit %d", got, bit)
					}
				}
				return
			}
			if got != c.want {
				t.Fatalf("%s: got %q, want %q", c.script, got, c.want)
			}
		})
	}

	// Overwrite the shell and busybox's sh with a trap; the agent's own work (exec of a direct argv,
	// files, tar) must never run it.
	p.sh(sb.ID, `rm /bin/sh && printf '#!/bin/busybox ash\ntouch /pwned\nexec /bin/busybox ash "$@"\n' > /bin/sh && chmod +x /bin/sh && cp /bin/sh /bin/bash`)
	ctx := context.Background()
	if _, _, exit := p.run(sb.ID, "/bin/busybox", "true"); exit.Code != 0 {
		t.Fatalf("direct exec after overwriting /bin/sh: %+v", exit)
	}
	if _, err := p.Client.WriteFile(ctx, sb.ID, "/tmp/f", strings.NewReader("x"), corral.WriteFileOptions{}); err != nil {
		t.Fatal(err)
	}
	if rc, err := p.Client.TarOut(ctx, sb.ID, "/tmp"); err == nil {
		rc.Close()
	}
	if _, err := p.Client.Stat(ctx, sb.ID, "/pwned"); !corral.IsNotFound(err) {
		t.Fatalf("/pwned exists: the agent ran the sandbox's /bin/sh (err %v)", err)
	}
}

// TestHarnessUnreachableGVisor is TestHarnessUnreachable for gVisor sandboxes, whose boundary
// differs: the agent's socket directory and binary are bind-mounted in (gVisor cannot accept on
// an inherited host socket), the sandbox sees gVisor's /proc and /sys, not the host's, and
// gVisor does not make init unkillable, so root inside can end its own sandbox (and nothing
// else). Mount sources never show host paths.
func TestHarnessUnreachableGVisor(t *testing.T) {
	needGVisor(t)
	p := withBaseOn(t, "gvisor")
	sb := p.create(corral.CreateRequest{})
	checks := []struct{ name, script, want string }{
		{"runs as root", "id -u", "0"},
		{"gVisor's kernel", "dmesg | grep -c gVisor", "1"},
		{"agent memory unreadable", "cat /proc/1/mem >/dev/null 2>&1 && echo readable || echo denied", "denied"},
		{"agent environment unreadable", "cat /proc/1/environ >/dev/null 2>&1 && echo readable || echo denied", "denied"},
		{"agent descriptor links unreadable", "readlink /proc/1/fd/3 2>/dev/null || echo denied", "denied"},
		{"agent binary read-only", "echo x > /.corral-agent 2>/dev/null && echo wrote || echo refused", "refused"},
		{"agent binary not remountable", "mount -o remount,rw /.corral-agent 2>/dev/null && echo remounted || echo refused", "refused"},
		{"no socket file anywhere", "find / -type s 2>/dev/null; true", ""},
		{"no unix socket at all", "tail -n +2 /proc/net/unix", ""},
		{"no agent directory", "ls -d /.corral 2>/dev/null || echo none", "none"},
		{"agent descriptors not openable", "for f in $(ls /proc/1/fd); do dd if=/proc/1/fd/$f of=/dev/null count=0 2>/dev/null && echo opened $f; done; echo done", "done"},
		{"no host path in mountinfo", "grep -c -e /var/lib -e /tmp/crl -e sandboxes /proc/self/mountinfo || true", "0"},
		{"no network but loopback", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '", "lo"},
		{"/proc/sys read-only", "echo 1 > /proc/sys/kernel/panic 2>/dev/null && echo wrote || echo refused", "refused"},
		{"no agent log files", "find /tmp /var /run /root -type f 2>/dev/null | wc -l", "0"},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			out, errOut, exit := p.run(sb.ID, "/bin/sh", "-c", c.script)
			if exit.Code != 0 {
				t.Fatalf("sh -c %q: exit %+v, stderr %q", c.script, exit, errOut)
			}
			if got := strings.TrimSpace(out); got != c.want {
				t.Fatalf("%s: got %q, want %q", c.script, got, c.want)
			}
		})
	}
	// The full hijack of the agent's channel is TestRedTeamGVisorChannel.
	// SIGKILL to the agent ends the sandbox; the edge notices and cleans up.
	// The kill may end the agent before it answers the start: that answer is lost with it.
	if _, err := p.Client.StartCommand(context.Background(), sb.ID, corral.ExecRequest{Argv: []string{"kill", "-9", "1"}}); err != nil && !corral.IsUnavailable(err) {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the sandbox whose agent was killed to stop", func() bool {
		got, err := p.Client.GetSandbox(context.Background(), sb.ID)
		return err == nil && (got.State == corral.StateStopped || got.State == corral.StateFailed)
	})
	p.Client.DeleteSandbox(context.Background(), sb.ID)
	p.Stop()
	assertNoLeftovers(t, p)
}

// TestLimits checks that the writable layer, memory, processes and open files are bounded.
func TestLimits(t *testing.T) { forRuntimes(t, testLimits) }

func testLimits(t *testing.T, rt string) {
	p := withBaseOn(t, rt)
	mem, cpus := int64(64<<20), 0.5
	if rt == "microvm" {
		// A VM's least memory: its kernel and agent need about 100 MiB. And a whole CPU: under
		// TCG, a guest reclaiming its way to the OOM kill below takes minutes on half a CPU.
		mem, cpus = 128<<20, 1.5
	}
	sb := p.create(corral.CreateRequest{Limits: corral.Limits{
		MemoryBytes: mem, Pids: 64, DiskBytes: 64 << 20, OpenFiles: 256, CPUs: cpus,
	}})
	// Disk: writing past 64 MiB fails with ENOSPC.
	out, _, exit := p.run(sb.ID, "/bin/sh", "-c", "dd if=/dev/zero of=/root/fill bs=1M count=200 2>&1; echo rc=$?")
	if !strings.Contains(out, "No space left on device") || exit.Code != 0 {
		t.Fatalf("disk limit: dd said %q", out)
	}
	if got := strings.TrimSpace(p.sh(sb.ID, "ulimit -n")); got != "256" {
		t.Fatalf("open files limit = %s, want 256", got)
	}
	// Processes: a fork loop stops at the pids limit and the sandbox still answers. Under gVisor
	// the host limit has headroom for gVisor's own threads (see runc.hostPids), so the same loop
	// fits, and the host's pids.max is checked instead.
	if rt != "gvisor" {
		out, _, _ = p.run(sb.ID, "/bin/sh", "-c", "for i in $(seq 100); do sleep 5 & done 2>&1 | grep -c 'fork' ; true")
		if strings.TrimSpace(out) == "0" {
			t.Fatalf("100 background sleeps with pids=64: no fork failed")
		}
	} else {
		b, err := os.ReadFile("/sys/fs/cgroup/pids" + p.Cgroup + "/" + sb.ID + "/pids.max")
		if err != nil {
			b, err = os.ReadFile("/sys/fs/cgroup" + p.Cgroup + "/" + sb.ID + "/pids.max")
		}
		if got := strings.TrimSpace(string(b)); err != nil || got != "320" {
			t.Fatalf("gVisor sandbox with pids=64: host pids.max = %q (%v), want 320 (64 + headroom 256)", got, err)
		}
		p.run(sb.ID, "/bin/sh", "-c", "for i in $(seq 50); do sleep 5 & done; true")
	}
	p.run(sb.ID, "/bin/sh", "-c", "kill $(pidof sleep) 2>/dev/null; true")
	if rt == "microvm" {
		// A VM's CPUs are its vCPUs (-smp: 1.5 rounds up to two), held to the quota by QEMU's
		// cgroup; its memory is its RAM.
		if got := strings.TrimSpace(p.sh(sb.ID, "grep -c ^processor /proc/cpuinfo")); got != "2" {
			t.Fatalf("cpus=1.5: the VM has %s CPUs, want 2", got)
		}
		if kb, _ := strconv.Atoi(strings.Fields(p.sh(sb.ID, "grep MemTotal /proc/meminfo") + " x 0")[1]); kb > 128<<10 || kb < 64<<10 {
			t.Fatalf("memory 128 MiB: the VM's MemTotal is %d KiB", kb)
		}
	}
	// A VM's QEMU has the cgroup a container would: the quota holds for it too.
	checkCPUQuota(t, p, sb.ID, int64(cpus*100000))
	// Memory: a process that grows past the limit is OOM-killed, the sandbox survives (in a VM,
	// by the guest kernel's OOM killer; the agent is its init, which that never kills). Under gVisor
	// the host's OOM killer ends the whole sandbox (gVisor's kernel has no OOM killer of its
	// own for the host's limit): the sandbox fails with reason oom_killed, the host is unharmed.
	if rt == "gvisor" {
		if _, err := p.Client.StartCommand(context.Background(), sb.ID, corral.ExecRequest{Argv: []string{"awk",
			`BEGIN { s = "x"; while (length(s) < 400000000) s = s s; print length(s) }`}}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "the OOM-killed gVisor sandbox to stop", func() bool {
			got, err := p.Client.GetSandbox(context.Background(), sb.ID)
			return err == nil && got.State == corral.StateFailed && got.Reason == corral.ReasonOOMKilled
		})
		return
	}
	_, _, exit = p.run(sb.ID, "awk", `BEGIN { s = "x"; while (length(s) < 400000000) s = s s; print length(s) }`)
	if exit.Signal != "SIGKILL" {
		t.Fatalf("awk growing a 400 MB string in a 64 MiB sandbox: %+v, want killed by SIGKILL (OOM)", exit)
	}
	if !exit.OOMKilled {
		t.Fatalf("exit of the OOM-killed command does not say oom_killed: %+v", exit)
	}
	if got := p.sh(sb.ID, "echo still here"); got != "still here\n" {
		t.Fatalf("after the OOM kill: %q", got)
	}
}

// checkCPUQuota checks a sandbox's CFS quota (in µs per 100 ms). The sandbox has no cgroup
// mount inside, so it reads the sandbox's cgroup from the host.
func checkCPUQuota(t *testing.T, p *corralProc, id string, want int64) {
	t.Helper()
	quota, _ := filepath.Glob("/sys/fs/cgroup/cpu*/" + strings.TrimPrefix(p.Cgroup, "/") + "/" + id + "/cpu.cfs_quota_us")
	if len(quota) == 0 {
		quota, _ = filepath.Glob("/sys/fs/cgroup/*" + p.Cgroup + "/" + id + "/cpu.max")
	}
	if len(quota) == 0 {
		t.Fatalf("no CPU quota file for %s under %s", id, p.Cgroup)
	}
	b, _ := os.ReadFile(quota[0])
	period, _ := os.ReadFile(filepath.Join(filepath.Dir(quota[0]), "cpu.cfs_period_us"))
	w := strconv.FormatInt(want, 10)
	if q, per := strings.TrimSpace(string(b)), strings.TrimSpace(string(period)); !(q == w && per == "100000") && !strings.HasPrefix(q, w+" 100000") {
		t.Fatalf("CPU quota: quota %q period %q, want %s/100000", q, per, w)
	}
}

// TestDeleteLeavesNothing creates and deletes sandboxes (some busy) and then checks the host for
// every kind of leftover.
func TestDeleteLeavesNothing(t *testing.T) { forRuntimes(t, testDeleteLeavesNothing) }

func testDeleteLeavesNothing(t *testing.T, rt string) {
	p := withBaseOn(t, rt)
	ctx := context.Background()
	n, disk := 24, int64(32<<20)
	if rt == "microvm" {
		n, disk = 6, 64<<20 // each is a boot; 64 MiB is a VM disk's least
	}
	for i := range n {
		sb := p.create(corral.CreateRequest{Limits: corral.Limits{DiskBytes: disk}})
		if i%2 == 0 {
			p.Client.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", "sleep 100 & sleep 100"}})
		}
		p.sh(sb.ID, "echo x > /root/x")
		if _, err := p.Client.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	p.Stop()
	assertNoLeftovers(t, p)
}

func assertNoLeftovers(t *testing.T, p *corralProc) {
	t.Helper()
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
		if strings.Contains(line, p.DataDir) {
			t.Errorf("mount left behind: %s", line)
		}
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range loops {
		b, _ := os.ReadFile(f)
		if strings.Contains(string(b), p.DataDir) {
			t.Errorf("loop device left behind: %s -> %s", f, strings.TrimSpace(string(b)))
		}
	}
	ctrls, _ := filepath.Glob("/sys/fs/cgroup/*" + p.Cgroup)
	for _, dir := range ctrls {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.IsDir() {
				t.Errorf("cgroup left behind: %s/%s", dir, e.Name())
			}
		}
		if tasks, err := os.ReadFile(filepath.Join(dir, "tasks")); err == nil && len(strings.TrimSpace(string(tasks))) > 0 {
			t.Errorf("processes left in %s: %s", dir, tasks)
		}
	}
	for _, sub := range []string{"sandboxes", "runc", "net", "vms"} {
		entries, _ := os.ReadDir(filepath.Join(p.DataDir, sub))
		for _, e := range entries {
			t.Errorf("state left behind: %s", filepath.Join(p.DataDir, sub, e.Name()))
		}
	}
	if pids := instanceQEMUPids(p); len(pids) > 0 {
		t.Errorf("QEMU processes left behind: %v", pids)
	}
	// The sandboxes' rootfs mount points (user namespaces; internal/runtime/runc/userns.go).
	sum := sha256.Sum256([]byte(filepath.Join(p.DataDir, "sandboxes")))
	roots := filepath.Join("/run/corral-roots", hex.EncodeToString(sum[:6]))
	if entries, _ := os.ReadDir(roots); len(entries) > 0 {
		t.Errorf("rootfs mount points left behind in %s: %d", roots, len(entries))
	}
	if strings.Contains(string(mi), roots) {
		t.Errorf("mounts left behind under %s", roots)
	}
	// LXCFS's view of the data dir, outside it (internal/lxcfs ViewDir): corral up stops LXCFS
	// when it stops with no sandbox left.
	if view := lxcfs.ViewDir(filepath.Join(p.DataDir, "lxcfs")); strings.Contains(string(mi), " "+view) {
		t.Errorf("LXCFS view left mounted at %s", view)
	} else if _, err := os.Stat(view); err == nil {
		t.Errorf("LXCFS view left behind at %s", view)
	}
	if pids := gvisorHolderPids(p.DataDir); len(pids) > 0 {
		t.Errorf("gVisor link holders left behind: %v", pids)
	}
	if ns, _ := filepath.Glob("/run/netns/corral-" + p.NetTag + "-*"); len(ns) > 0 {
		t.Errorf("network namespaces left behind: %v", ns)
	}
	if links, _ := filepath.Glob("/sys/class/net/cr" + p.NetTag + "-*"); len(links) > 0 {
		t.Errorf("veths left behind: %v", links)
	}
	if c, err := nftables.New(); err == nil {
		tables, _ := c.ListTables()
		for _, tb := range tables {
			if tb.Name == "corral-"+p.NetTag || tb.Name == "corral-"+p.NetTag+"-nat" {
				t.Errorf("nftables table left behind: %s", tb.Name)
			}
		}
	}
}

// gvisorHolderPids returns the pids of the gVisor link holders (`<data dir>/.../corral-agent
// hold`) of the corral whose data directory is dataDir.
func gvisorHolderPids(dataDir string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if len(args) == 2 && args[1] == "hold" && strings.HasPrefix(args[0], dataDir+"/") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// ptraceProbe attaches to pid 1 (the agent) with ptrace and prints the result.
const ptraceProbe = `package main

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
)

func main() {
	pid, _ := strconv.Atoi(os.Args[1])
	err := syscall.PtraceAttach(pid)
	if err == nil {
		syscall.PtraceDetach(pid)
		fmt.Println("attached")
		return
	}
	fmt.Println(err)
}
`

// TestAgentNotPtraceable runs a real ptrace(PTRACE_ATTACH) against the agent from inside the
// sandbox, as root: it must be refused.
func TestAgentNotPtraceable(t *testing.T) { forRuntimes(t, testAgentNotPtraceable) }

func testAgentNotPtraceable(t *testing.T, rt string) {
	p := withBaseOn(t, rt)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "main.go"), []byte(ptraceProbe), 0o644)
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module probe\ngo 1.21\n"), 0o644)
	build := exec.Command("go", "build", "-o", "probe", ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the ptrace probe: %v\n%s", err, out)
	}
	f, err := os.Open(filepath.Join(dir, "probe"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sb := p.create(corral.CreateRequest{})
	if _, err := p.Client.WriteFile(context.Background(), sb.ID, "/root/probe", f, corral.WriteFileOptions{Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	// The probe works: it can attach to an ordinary process of the sandbox, its own child (the
	// shell's background sleep, once the shell has exec'd the probe), since gVisor, like Yama's
	// ptrace_scope 1, lets a process attach to its descendants only...
	if out := p.sh(sb.ID, "sleep 30 & exec /root/probe $!"); strings.TrimSpace(out) != "attached" {
		t.Fatalf("ptrace attach to a sandbox process: %q, want attached (the probe is broken)", out)
	}
	// ...but not to the agent.
	out, _, exit := p.run(sb.ID, "/root/probe", "1")
	if exit.Code != 0 || strings.TrimSpace(out) != "operation not permitted" {
		t.Fatalf("ptrace attach to the agent from inside as root: %q (exit %+v), want operation not permitted", out, exit)
	}
}
