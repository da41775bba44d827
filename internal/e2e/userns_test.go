package e2e

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestUsernsOwners: with user namespaces (the default), files a sandbox owns keep their inside
// owners everywhere they travel: on its disk (stored as inside ids), through the files API,
// tar export, corral cp, a snapshot and a sandbox made from it; and files put in from outside
// belong to the sandbox's root, not to a host uid.
func TestUsernsOwners(t *testing.T) {
	p := withBase(t)
	ctx := context.Background()
	info, err := p.Client.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.UserNS == "" {
		t.Skipf("no user namespaces here: %s", info.UserNSUnavailable)
	}
	sb := p.create(corral.CreateRequest{})
	if got := p.sh(sb.ID, "mkdir /root/d && echo hi > /root/d/f && chown -R 1234:1234 /root/d && stat -c %u:%g /root/d/f"); got != "1234:1234\n" {
		t.Fatalf("inside after chown: %q", got)
	}

	t.Run("disk stores inside ids", func(t *testing.T) {
		files, _ := filepath.Glob(filepath.Join(p.DataDir, "sandboxes", "*", "disk", "upper", "root", "d", "f"))
		if len(files) != 1 {
			t.Fatalf("upper-dir copies of /root/d/f: %v", files)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(files[0], &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != 1234 || st.Gid != 1234 {
			t.Fatalf("on the host's disk image: %d:%d, want 1234:1234 (inside ids)", st.Uid, st.Gid)
		}
	})

	t.Run("files API", func(t *testing.T) {
		fi, err := p.Client.Stat(ctx, sb.ID, "/root/d/f")
		if err != nil {
			t.Fatal(err)
		}
		if fi.UID != 1234 || fi.GID != 1234 {
			t.Fatalf("Stat: %d:%d", fi.UID, fi.GID)
		}
		if _, err := p.Client.WriteFile(ctx, sb.ID, "/root/put", strings.NewReader("x"), corral.WriteFileOptions{}); err != nil {
			t.Fatal(err)
		}
		if got := p.sh(sb.ID, "stat -c %u:%g /root/put"); got != "0:0\n" {
			t.Fatalf("file written through the API: %q, want the sandbox's root", got)
		}
	})

	t.Run("tar export", func(t *testing.T) {
		rc, err := p.Client.TarOut(ctx, sb.ID, "/root/d")
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		checkTarOwner(t, rc, "f", 1234)
	})

	t.Run("corral cp", func(t *testing.T) {
		out, errOut, code := p.cli("", "cp", sb.ID+":/root/d", "-")
		if code != 0 {
			t.Fatalf("corral cp out: %d %s", code, errOut)
		}
		checkTarOwner(t, strings.NewReader(out), "f", 1234)
		local := filepath.Join(t.TempDir(), "in")
		os.WriteFile(local, []byte("in"), 0o644)
		if _, errOut, code := p.cli("", "cp", local, sb.ID+":/root/in"); code != 0 {
			t.Fatalf("corral cp in: %d %s", code, errOut)
		}
		if got := p.sh(sb.ID, "stat -c %u:%g /root/in"); got != "0:0\n" {
			t.Fatalf("file copied in: %q, want the sandbox's root", got)
		}
	})

	t.Run("user outside the namespace", func(t *testing.T) {
		// The namespace maps ids 0-65535: an exec as another is a 400 naming the field.
		for _, u := range []string{"70000", "0:65536"} {
			_, _, _, err := p.Client.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}, User: u})
			if !corral.IsInvalid(err) || !strings.Contains(err.Error(), "user") || !strings.Contains(err.Error(), "outside") {
				t.Errorf("exec as %s: %v, want invalid user", u, err)
			}
		}
		if got := p.sh(sb.ID, "echo ok"); got != "ok\n" {
			t.Fatalf("after the refused execs: %q", got)
		}
	})

	t.Run("snapshot and from-snapshot", func(t *testing.T) {
		if _, err := p.Client.Snapshot(ctx, sb.ID, corral.SnapshotRequest{Name: "owners", Version: "1"}); err != nil {
			t.Fatal(err)
		}
		child := p.create(corral.CreateRequest{FromSnapshot: "owners:1"})
		if got := p.sh(child.ID, "stat -c %u:%g /root/d/f /root/put; cat /root/d/f"); got != "1234:1234\n0:0\nhi\n" {
			t.Fatalf("sandbox from the snapshot: %q", got)
		}
		// The child's root may change what it inherited (the layer is idmapped to it).
		p.sh(child.ID, "echo more >> /root/d/f && chown 0:0 /root/d/f")
	})
}

// checkTarOwner reads a tar stream and checks the entry whose name ends in name is owned by uid.
func checkTarOwner(t *testing.T, r io.Reader, name string, uid int) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("no %s in the tar", name)
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(h.Name, "/"+name) || h.Name == name {
			if h.Uid != uid || h.Gid != uid {
				t.Fatalf("tar entry %s: owner %d:%d, want %d:%d", h.Name, h.Uid, h.Gid, uid, uid)
			}
			return
		}
	}
}

// TestSandboxBudgets: with user namespaces each sandbox has its own per-user kernel budgets.
// One sandbox uses up each (inotify instances, inotify watches, message-queue bytes,
// processes of one user); another sandbox still gets its whole budget, and the host's root is
// untouched.
func TestSandboxBudgets(t *testing.T) {
	p := withBase(t, "--sandbox-inotify-instances", "8", "--sandbox-inotify-watches", "32",
		"--sandbox-mqueue-bytes", "16384", "--sandbox-nproc", "40")
	ctx := context.Background()
	if info, err := p.Client.Info(ctx); err != nil || info.UserNS == "" {
		t.Skipf("no user namespaces here: %v %s", err, info.UserNSUnavailable)
	}
	probe := buildBudgetProbe(t)
	a, b := p.create(corral.CreateRequest{}), p.create(corral.CreateRequest{})
	for _, sb := range []*corral.Sandbox{a, b} {
		f, err := os.Open(probe)
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Client.WriteFile(ctx, sb.ID, "/bin/budget", f, corral.WriteFileOptions{Mode: 0o755})
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	// take runs the probe as user in sb and returns how many it got and its error.
	take := func(sb *corral.Sandbox, user, what string, n int) (int, string) {
		t.Helper()
		out, errOut, exit := p.runReq(sb.ID, corral.ExecRequest{Argv: []string{"budget", what, strconv.Itoa(n)}, User: user})
		if exit == nil || exit.Code != 0 {
			// The probe could not even start (no process left to the user).
			return 0, fmt.Sprintf("exit %+v %s", exit, errOut)
		}
		var got int
		var msg string
		fields := strings.SplitN(strings.TrimSpace(out), " ", 2)
		got, _ = strconv.Atoi(fields[0])
		if len(fields) > 1 {
			msg = fields[1]
		}
		return got, msg
	}
	// hold has the probe take what it can in sb and keep it, in the background.
	hold := func(sb *corral.Sandbox, user, what string, n int) string {
		t.Helper()
		out := "/tmp/held-" + what
		p.runReq(sb.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", "budget -hold " + what + " " + strconv.Itoa(n) + " > " + out + " 2>&1 &"}, User: user})
		var got string
		eventually(t, 30*time.Second, what+" to be taken", func() bool {
			o, _, _ := p.run(sb.ID, "cat", out)
			got = strings.TrimSpace(o)
			return got != ""
		})
		return got
	}
	for _, c := range []struct {
		what, user string
		limit      int
		errWant    string
		host       func() error
	}{
		{"inotify", "", 8, "too many open files", func() error {
			fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
			unix.Close(fd)
			return err
		}},
		{"watches", "", 32, "no space left on device", func() error {
			fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			_, err = unix.InotifyAddWatch(fd, t.TempDir(), unix.IN_CREATE)
			return err
		}},
		{"mqueue", "", 16, "too many open files", hostMqueue},
		// As an ordinary user: the agent runs as the sandbox's root and must keep its threads.
		{"procs", "1000", 40, "resource temporarily unavailable", func() error { return exec.Command("true").Run() }},
	} {
		t.Run(c.what, func(t *testing.T) {
			held := hold(a, c.user, c.what, 1000)
			n, _ := strconv.Atoi(strings.Fields(held)[0])
			if n == 0 || n > c.limit || !strings.Contains(held, c.errWant) {
				t.Fatalf("sandbox A: %q, want at most %d before %q", held, c.limit, c.errWant)
			}
			if got, msg := take(a, c.user, c.what, 1); got != 0 {
				ps, _, _ := p.run(a.ID, "ps", "-o", "pid,user,args")
				t.Fatalf("sandbox A could take more after using up its budget (%q): %d %s\n%s", held, got, msg, ps)
			}
			if got, msg := take(b, c.user, c.what, 1000); got == 0 || got > c.limit {
				t.Fatalf("sandbox B after A used up its budget: %d (%s), want 1..%d", got, msg, c.limit)
			}
			if err := c.host(); err != nil {
				t.Fatalf("the host's root after A used up its budget: %v", err)
			}
			// Give A its budget back for the next case.
			p.run(a.ID, "/bin/sh", "-c", "killall -9 budget sleep")
			eventually(t, 10*time.Second, "the holders to end", func() bool {
				out, _, _ := p.run(a.ID, "/bin/sh", "-c", "pidof budget sleep || true")
				return strings.TrimSpace(out) == ""
			})
		})
	}
	t.Run("keyrings", func(t *testing.T) {
		// The kernel's key quotas are per host uid, not per namespace; the sandbox may not reach
		// the keyring at all (seccomp), so no sandbox can spend another's.
		if out, _, exit := p.run(a.ID, "/bin/sh", "-c", "keyctl add user k v @s 2>&1 || echo refused"); exit == nil || !strings.Contains(out, "refused") && !strings.Contains(out, "not found") {
			t.Fatalf("keyctl in a sandbox: %q %+v", out, exit)
		}
	})
}

// hostMqueue opens and removes a POSIX message queue as this (the host's root) process.
func hostMqueue() error {
	name, _ := unix.BytePtrFromString(fmt.Sprintf("corral-e2e-%d", os.Getpid()))
	attr := [8]int64{0, 1, 1024, 0}
	fd, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(name)), uintptr(unix.O_CREAT|unix.O_RDWR), 0o600, uintptr(unsafe.Pointer(&attr[0])), 0, 0)
	if e != 0 {
		return e
	}
	unix.Close(int(fd))
	unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(name)), 0, 0)
	return nil
}

// buildBudgetProbe builds testdata/budget (static) and returns its path.
func buildBudgetProbe(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "budget")
	cmd := exec.Command("go", "build", "-o", out, "./testdata/budget")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the budget probe: %v\n%s", err, b)
	}
	return out
}

// TestUsernsOptOut: corral up --no-userns runs container sandboxes as before (their root is the
// host's), and corral info says so; with the default, it says they are in use.
func TestUsernsOptOut(t *testing.T) {
	p := withBase(t, "--no-userns")
	out, errOut, code := p.cli("", "info")
	if code != 0 || !strings.Contains(out, "User namespaces:") || !strings.Contains(out, "off: corral up --no-userns") {
		t.Fatalf("corral info with --no-userns: %d %q %s", code, out, errOut)
	}
	sb := p.create(corral.CreateRequest{})
	m := strconv.Itoa(100000 + int(time.Now().UnixNano()%800000))
	p.sh(sb.ID, "setsid sleep "+m+" >/dev/null 2>&1 < /dev/null &")
	var pid int
	eventually(t, 10*time.Second, "the marker process", func() bool {
		pid = hostPidByCmdline("sleep\x00" + m + "\x00")
		return pid != 0
	})
	if ids := hostIDs(t, pid); ids[0] != 0 {
		t.Fatalf("with --no-userns the sandbox's root is uid %d on the host, want 0", ids[0])
	}

	q := withBase(t)
	if out, _, _ := q.cli("", "info"); !strings.Contains(out, "in use with idmapped mounts") {
		t.Fatalf("corral info by default: %q", out)
	}
}
