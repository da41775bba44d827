package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestRedTeamUserns (issue 23 item 1): root inside a sandbox is nobody on the host.
//
//   - runc: a process of the sandbox (its root's) is, seen from the host's /proc, an
//     unprivileged uid and gid of the sandbox's own range, in a user namespace mapping its 0 there;
//     another sandbox's root is another uid. A process escaping with those ids finds the host's
//     files closed to it: /etc/shadow, a root-owned file it would overwrite, Corral's data dir
//     (the other sandbox's disk in it) and the other sandbox's root filesystem. Inside, root can
//     no longer make device nodes (CAP_MKNOD is void in a user namespace).
//   - gVisor: the Sentry (runsc-sandbox), which serves the sandbox's system calls, runs as the
//     host's nobody in a user namespace of its own, not as root. (Its gofer stays root: it
//     serves the sandbox's files from the host; see docs/ARCHITECTURE.md.)
//   - microvm: QEMU runs as a uid of the data dir's VM range (issue 30), never root.
func TestRedTeamUserns(t *testing.T) {
	p := withBase(t)
	ctx := context.Background()
	info, err := p.Client.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.UserNS == "" {
		t.Skipf("no user namespaces here: %s", info.UserNSUnavailable)
	}
	forRuntimes(t, func(t *testing.T, rt string) {
		switch rt {
		case "runc":
			redteamUsernsRunc(t, p)
		case "gvisor":
			sb := p.create(corral.CreateRequest{Runtime: "gvisor"})
			p.sh(sb.ID, "true")
			pids := hostPidsNamed(t, p, "runsc-sandbox")
			if len(pids) == 0 {
				t.Fatal("no runsc-sandbox process of this Corral on the host")
			}
			for _, pid := range pids {
				if ids := hostIDs(t, pid); ids[0] != 65534 || ids[1] != 65534 {
					t.Errorf("runsc-sandbox (pid %d) runs as uid:gid %v on the host, want nobody (65534)", pid, ids)
				}
			}
		case "microvm":
			p.create(corral.CreateRequest{Tier: "microvm", Limits: corral.Limits{MemoryBytes: 256 << 20}})
			pids := hostPidsNamed(t, p, "qemu")
			if len(pids) == 0 {
				t.Fatal("no QEMU process of this Corral on the host")
			}
			for _, pid := range pids {
				if ids := hostIDs(t, pid); ids[0] == 0 || ids[1] == 0 {
					t.Errorf("QEMU (pid %d) runs as uid:gid %v on the host", pid, ids)
				}
			}
		}
	})
}

func redteamUsernsRunc(t *testing.T, p *corralProc) {
	a, b := p.create(corral.CreateRequest{Runtime: "runc"}), p.create(corral.CreateRequest{Runtime: "runc"})
	// A marker process in each, found from the host by its command line.
	marks := map[string]string{}
	for _, sb := range []*corral.Sandbox{a, b} {
		m := strconv.Itoa(100000 + rand.IntN(800000))
		p.sh(sb.ID, "setsid sleep "+m+" >/dev/null 2>&1 < /dev/null &")
		marks[sb.ID] = m
	}
	find := func(id string) int {
		var pid int
		eventually(t, 10*time.Second, "the marker process of "+id, func() bool {
			pid = hostPidByCmdline("sleep\x00" + marks[id] + "\x00")
			return pid != 0
		})
		return pid
	}
	pa, pb := find(a.ID), find(b.ID)
	ida, idb := hostIDs(t, pa), hostIDs(t, pb)
	if inside := p.sh(a.ID, "id -u; id -g"); inside != "0\n0\n" {
		t.Fatalf("the marker's user inside: %q, want root", inside)
	}
	for _, c := range []struct {
		id  string
		ids [2]uint32
		pid int
	}{{a.ID, ida, pa}, {b.ID, idb, pb}} {
		if c.ids[0] < 1<<31 || c.ids[1] != c.ids[0] {
			t.Errorf("root of %s is uid:gid %v on the host, want an unprivileged range's (>= 2^31)", c.id, c.ids)
		}
		um, _ := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", c.pid))
		if f := strings.Fields(string(um)); len(f) != 3 || f[0] != "0" || f[1] != strconv.FormatUint(uint64(c.ids[0]), 10) || f[2] != "65536" {
			t.Errorf("uid_map of %s's process: %q, want 0 %d 65536", c.id, um, c.ids[0])
		}
	}
	if ida == idb {
		t.Errorf("two sandboxes share host uid %d", ida[0])
	}
	if inside := p.sh(a.ID, "cat /proc/self/uid_map"); !strings.Contains(inside, strconv.FormatUint(uint64(ida[0]), 10)) {
		t.Errorf("uid_map inside: %q", inside)
	}

	// The sandbox's root cannot make device nodes any more.
	out, _, exit := p.run(a.ID, "/bin/sh", "-c", "mknod /tmp/mem c 1 1 && echo made")
	if exit == nil || exit.Code == 0 || strings.Contains(out, "made") {
		t.Errorf("mknod of /dev/mem's device inside: %q %+v, want refused", out, exit)
	}

	// A process that escaped with a's host ids finds the host's files closed.
	victim := filepath.Join(t.TempDir(), "root-owned")
	os.WriteFile(victim, []byte("host\n"), 0o644)
	os.Chmod(filepath.Dir(victim), 0o755)
	for _, c := range []struct{ what, script string }{
		{"read /etc/shadow", "cat /etc/shadow"},
		{"overwrite a root-owned file", "echo pwned >> " + victim},
		{"list Corral's data dir", "ls " + p.DataDir},
		{"read b's disk", "ls " + filepath.Join(p.DataDir, "sandboxes")},
		{"enter b's root filesystem", "ls " + rootfsOwnedBy(t, idb[0]) + "/root"},
		// The host keeps no mount of a started sandbox's root (the runtime's detachStarted):
		// its processes' /proc/PID/root is the way there, open to its own ids only.
		{"enter b's root filesystem through its process", fmt.Sprintf("ls /proc/%d/root/root", pb)},
	} {
		cmd := exec.Command("/bin/sh", "-c", c.script)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: ida[0], Gid: ida[1]}}
		var outb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &outb, &outb
		if err := cmd.Run(); err == nil {
			t.Errorf("as a's host uid %d: %s succeeded: %.300s", ida[0], c.what, outb.String())
		}
	}
	// The same way in is open to b's own ids: what closed it to a was its ids.
	if ents, err := os.ReadDir(rootfsOwnedBy(t, idb[0])); err != nil || len(ents) != 0 {
		t.Errorf("b's root filesystem is still mounted on the host: %v %v", ents, err)
	}
	cmd := exec.Command("/bin/ls", fmt.Sprintf("/proc/%d/root/root", pb))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: idb[0], Gid: idb[1]}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("b's root filesystem as b's own host uid: %v %s", err, out)
	}
	if b, _ := os.ReadFile(victim); string(b) != "host\n" {
		t.Errorf("root-owned file changed: %q", b)
	}
}

// hostIDs returns the effective uid and gid of a host process.
func hostIDs(t *testing.T, pid int) [2]uint32 {
	t.Helper()
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	var ids [2]uint32
	for _, line := range strings.Split(string(st), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && (f[0] == "Uid:" || f[0] == "Gid:") {
			n, _ := strconv.ParseUint(f[2], 10, 32)
			if f[0] == "Uid:" {
				ids[0] = uint32(n)
			} else {
				ids[1] = uint32(n)
			}
		}
	}
	return ids
}

// hostPidByCmdline returns a host process whose command line starts with prefix (NULs
// between arguments), or 0.
func hostPidByCmdline(prefix string) int {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range procs {
		b, _ := os.ReadFile(f)
		if strings.HasPrefix(string(b), prefix) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			return pid
		}
	}
	return 0
}

// hostPidsNamed returns the host processes of p's sandboxes (in its cgroup parent) whose
// argv[0]'s base name starts with name.
func hostPidsNamed(t *testing.T, p *corralProc, name string) []int {
	t.Helper()
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range procs {
		cmdline, _ := os.ReadFile(f)
		argv0, _, _ := strings.Cut(string(cmdline), "\x00")
		if !strings.HasPrefix(filepath.Base(argv0), name) {
			continue
		}
		cg, _ := os.ReadFile(filepath.Join(filepath.Dir(f), "cgroup"))
		if strings.Contains(string(cg), p.Cgroup+"/") {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			pids = append(pids, pid)
		}
	}
	return pids
}

// rootfsOwnedBy returns the host path of the root filesystem of the sandbox whose root is uid.
func rootfsOwnedBy(t *testing.T, uid uint32) string {
	t.Helper()
	dirs, _ := filepath.Glob("/run/corral-roots/*/*")
	for _, d := range dirs {
		var st syscall.Stat_t
		if syscall.Stat(d, &st) == nil && st.Uid == uid {
			return filepath.Join(d, "rootfs")
		}
	}
	t.Fatalf("no root filesystem directory owned by uid %d under /run/corral-roots", uid)
	return ""
}
