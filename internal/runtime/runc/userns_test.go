package runc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/mountinfo"
	"github.com/corral-dev/corral/internal/runtime"
)

func usernsEnv(t *testing.T, slots int) *testEnv {
	t.Helper()
	e := newTestEnv(t, func(c *Config) { c.UserNS = &UserNS{UIDBase: 0xF8000000, Slots: slots} })
	if why := e.r.UserNSStatus(); why != "" {
		t.Skipf("no user namespaces here: %s", why)
	}
	return e
}

// TestUserNSHelper: with corral-runcd, its C helper makes the namespaces (one thread: no Go
// runtime started), as the slot's uid, with the id maps; a corral-runcd the slots' uids cannot
// execute (under a directory only root may search) leaves them to the agent's helper, and
// sandboxes still get their budgets.
func TestUserNSHelper(t *testing.T) {
	e := usernsEnv(t, 4)
	if e.cfg.Runcd == "" {
		t.Skip("corral-runcd is off (CORRAL_TEST_RUNCD=off)")
	}
	if e.r.nsHelper != fx.runcd {
		t.Fatalf("nsHelper = %q, want %s", e.r.nsHelper, fx.runcd)
	}
	base := e.r.slotBase(3)
	h, err := e.r.startUserns(context.Background(), base, nil)
	if err != nil {
		t.Fatal(err)
	}
	pid := h.cmd.Process.Pid
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	uidMap, _ := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", pid))
	gidMap, _ := os.ReadFile(fmt.Sprintf("/proc/%d/gid_map", pid))
	h.close()
	if exe != fx.runcd {
		t.Errorf("helper runs %q, want %s", exe, fx.runcd)
	}
	if !regexp.MustCompile(`(?m)^Threads:\s+1$`).Match(status) {
		t.Errorf("helper has more than one thread (a Go runtime started):\n%s", status)
	}
	if !regexp.MustCompile(fmt.Sprintf(`(?m)^Uid:\s+\d+\s+%d\s`, base)).Match(status) {
		t.Errorf("helper's effective uid is not the slot's %d:\n%s", base, status)
	}
	for what, m := range map[string][]byte{"uid_map": uidMap, "gid_map": gidMap} {
		if got := strings.Join(strings.Fields(string(m)), " "); got != fmt.Sprintf("0 %d 65536", base) {
			t.Errorf("%s %q", what, got)
		}
	}

	hidden := filepath.Join(t.TempDir(), "corral-runcd") // t.TempDir() is 0700
	b, err := os.ReadFile(fx.runcd)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hidden, b, 0o755); err != nil {
		t.Fatal(err)
	}
	f := newTestEnv(t, func(c *Config) { c.Runcd = hidden; c.UserNS = &UserNS{UIDBase: 0xF8000000 + 4*UserNSSize, Slots: 2} })
	if f.r.nsHelper != "" {
		t.Fatalf("nsHelper = %q for a binary the slots' uids cannot execute", f.r.nsHelper)
	}
	sb := f.create(f.spec("u-agent-helper"))
	if got := strings.TrimSpace(okSh(t, sb.AgentSocket, "cat /proc/sys/user/max_inotify_instances")); got != "128" {
		t.Errorf("max_inotify_instances %q inside, want 128", got)
	}
}

// TestUserNSSandbox: a sandbox's root is its slot's first host uid, in a namespace that maps
// 65536 ids there and is owned by that uid; its disk stores inside ids; the namespace has the
// configured inotify budget.
func TestUserNSSandbox(t *testing.T) {
	e := usernsEnv(t, 4)
	s := e.spec("u1")
	s.OpenFiles = 321
	sb := e.create(s)
	if sb.HostUID < 0xF8000000 {
		t.Fatalf("HostUID = %d", sb.HostUID)
	}
	// Its rlimits, set by runc or, without CAP_SYS_RESOURCE, by the agent on itself
	// (internal/rlimitenv), whose variable no command sees.
	limits := okSh(t, sb.AgentSocket, "grep -E '^Max (open files|processes|msgqueue size)' /proc/self/limits; env | grep -c CORRAL_RLIMITS || true")
	for _, want := range []string{
		`Max processes +` + strconv.FormatInt(2*hostPids(&s), 10) + ` +` + strconv.FormatInt(2*hostPids(&s), 10) + ` `,
		`Max open files +321 +321 `,
		`Max msgqueue size +` + strconv.FormatInt(e.r.budgets().MsgQueueBytes, 10) + ` +` + strconv.FormatInt(e.r.budgets().MsgQueueBytes, 10) + ` `,
		`(?m)^0$`,
	} {
		if !regexp.MustCompile(want).MatchString(limits) {
			t.Errorf("the sandbox's limits lack %q:\n%s", want, limits)
		}
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", sb.Pid))
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("Uid:\t%d\t%d\t%d\t%d", sb.HostUID, sb.HostUID, sb.HostUID, sb.HostUID)
	if !strings.Contains(string(st), want) {
		t.Errorf("agent's status lacks %q", want)
	}
	if got := strings.Join(strings.Fields(okSh(t, sb.AgentSocket, "cat /proc/self/uid_map /proc/sys/user/max_inotify_instances; id -u")), " "); got != fmt.Sprintf("0 %d 65536 128 0", sb.HostUID) {
		t.Errorf("inside: %q", got)
	}
	okSh(t, sb.AgentSocket, "echo x > /f && chown 1234:1234 /f && mkdir -p /home/u && chown 42:43 /home/u")
	for p, want := range map[string][2]uint32{"f": {1234, 1234}, "home/u": {42, 43}} {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(sb.Dir, diskMount, "upper", p), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != want[0] || st.Gid != want[1] {
			t.Errorf("%s on the disk: %d:%d, want %v (inside ids)", p, st.Uid, st.Gid, want)
		}
	}
	// Every bind's source is reachable by the sandbox's root as the host sees it, so runc's init
	// binds it itself (no round trip through runc's parent per source, bindDir).
	var cfg struct {
		Mounts []struct{ Type, Source string }
	}
	if b, err := os.ReadFile(filepath.Join(sb.Dir, "config.json")); err != nil || json.Unmarshal(b, &cfg) != nil {
		t.Fatalf("read config.json: %v", err)
	}
	binds := 0
	for _, m := range cfg.Mounts {
		if m.Type != "bind" {
			continue
		}
		binds++
		src := m.Source
		if _, err := os.Lstat(src); errors.Is(err, os.ErrNotExist) {
			// A source whose mount was detached once the sandbox started (/etc/hosts): its
			// directory must have been within reach.
			src = filepath.Dir(src)
		}
		cmd := exec.Command("test", "-e", src)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: sb.HostUID, Gid: sb.HostUID}}
		if err := cmd.Run(); err != nil {
			t.Errorf("bind source %s is out of the sandbox root's (host uid %d) reach: %v", m.Source, sb.HostUID, err)
		}
	}
	if binds == 0 {
		t.Error("no bind mount in config.json (want at least /etc/hosts)")
	}
	// The host keeps none of the mounts the started sandbox has its own copies of (its root and
	// /etc/hosts' tmpfs): they would only lengthen every later create's runc (detachStarted).
	if ms, err := mountinfo.Under(e.r.rootDir(sb.ID)); err != nil || len(ms) != 0 {
		t.Errorf("host mounts left under the sandbox's root directory: %v %v", ms, err)
	}
	// The layers are unchanged on the host.
	var lst syscall.Stat_t
	syscall.Stat(filepath.Join(fx.base, "bin"), &lst)
	if lst.Uid != 0 {
		t.Errorf("layer's /bin is owned by %d on the host", lst.Uid)
	}
}

// TestUserNSSlots: slots are distinct, survive a new Runtime, run out with a clear error, and
// are free again once a sandbox is deleted.
func TestUserNSSlots(t *testing.T) {
	e := usernsEnv(t, 2)
	ctx := context.Background()
	a := e.create(e.spec("s1"))
	if err := e.r.Close(); err != nil {
		t.Fatal(err)
	}
	e.r = e.open() // a restart: it must read s1's slot back
	b := e.create(e.spec("s2"))
	if a.HostUID == b.HostUID || e.r.HostUID("s1") != a.HostUID {
		t.Fatalf("slots: s1 %d (now %d), s2 %d", a.HostUID, e.r.HostUID("s1"), b.HostUID)
	}
	if _, err := e.r.Create(ctx, runtime.Spec(e.spec("s3"))); !errors.Is(err, errdefs.ErrExhausted) {
		t.Fatalf("third Create with 2 slots: %v, want exhausted", err)
	}
	if ids, _ := e.r.List(ctx); len(ids) != 2 {
		t.Errorf("the refused Create left state: %v", ids)
	}
	if err := e.r.Delete(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	c := e.create(e.spec("s3"))
	if c.HostUID != a.HostUID {
		t.Errorf("s3 got %d, want s1's freed %d", c.HostUID, a.HostUID)
	}
}

// TestBudgetsValidate names the field of a budget out of range.
func TestBudgetsValidate(t *testing.T) {
	for _, c := range []struct {
		b     Budgets
		field string
	}{
		{Budgets{InotifyInstances: 1 << 31}, "InotifyInstances"},
		{Budgets{InotifyWatches: -1}, "InotifyWatches"},
		{Budgets{MsgQueueBytes: -5}, "MsgQueueBytes"},
		{Budgets{Procs: 1 << 40}, "Procs"},
	} {
		err := c.b.Validate()
		if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Field(err) != c.field {
			t.Errorf("Validate(%+v) = %v, want invalid %s", c.b, err, c.field)
		}
	}
	if err := (Budgets{}).Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	if err := (&UserNS{UIDBase: 0xFFFF0000 - UserNSSize, Slots: 2}).validate(); errdefs.Field(err) != "UserNS.Slots" {
		t.Errorf("a range past the last uid: %v", err)
	}
}

// TestUserNSPool: once a Create named the agent, user namespaces are made ahead; a Create takes
// one (never one another sandbox had: each sandbox's namespace is its own), and Close ends the
// helpers left and frees their slots.
func TestUserNSPool(t *testing.T) {
	e := usernsEnv(t, 4)
	a := e.create(e.spec("p1"))
	pooledSlots := func() []int {
		e.r.slots.mu.Lock()
		defer e.r.slots.mu.Unlock()
		var out []int
		for s, o := range e.r.slots.used {
			if o == poolOwner {
				out = append(out, s)
			}
		}
		return out
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(e.r.nsReady) < usernsPoolSize {
		if time.Now().After(deadline) {
			t.Fatalf("%d user namespaces made ahead, want %d", len(e.r.nsReady), usernsPoolSize)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := pooledSlots(); len(got) != usernsPoolSize {
		t.Fatalf("pool slots %v, want %d", got, usernsPoolSize)
	}
	b := e.create(e.spec("p2"))
	nsOf := func(pid int) string {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/user", pid))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	if nsOf(a.Pid) == nsOf(b.Pid) || a.HostUID == b.HostUID {
		t.Fatalf("p1 and p2 share a user namespace or uid (%d, %d)", a.HostUID, b.HostUID)
	}
	if slot, ok := e.r.slots.slotOf("p2"); !ok || e.r.slotBase(slot) != b.HostUID {
		t.Fatalf("p2's slot %d %v, uid %d", slot, ok, b.HostUID)
	}
	// The pooled namespace maps p2's ids as a fresh one does.
	if got := strings.Join(strings.Fields(okSh(t, b.AgentSocket, "cat /proc/self/uid_map /proc/sys/user/max_inotify_instances")), " "); got != fmt.Sprintf("0 %d 65536 128", b.HostUID) {
		t.Errorf("p2 inside: %q", got)
	}
	var helpers []int
	for _, p := range e.r.nsReadySnapshot() {
		helpers = append(helpers, p.h.cmd.Process.Pid)
	}
	if err := e.r.Close(); err != nil {
		t.Fatal(err)
	}
	if got := pooledSlots(); len(got) != 0 {
		t.Errorf("slots still held by the pool after Close: %v", got)
	}
	for _, pid := range helpers {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			t.Errorf("helper %d of a namespace made ahead still runs after Close", pid)
		}
	}
	e.r = e.open()
}

// nsReadySnapshot returns the user namespaces made ahead, leaving them in the pool (one the
// refill's sends displace is closed).
func (r *Runtime) nsReadySnapshot() []pooledUserns {
	var out []pooledUserns
	for range len(r.nsReady) {
		select {
		case p := <-r.nsReady:
			out = append(out, p)
		default:
		}
	}
	for _, p := range out {
		select {
		case r.nsReady <- p:
		default:
			p.h.close()
			r.slots.releaseSlot(p.slot)
		}
	}
	return out
}

// TestUserNSPoolLastSlot: a create that finds no slot free while the pool's refill holds the
// last one for a namespace it is still making waits for that namespace and takes it, rather
// than fail as a node with no room (what TestUserNSSlots met now and then under load).
func TestUserNSPoolLastSlot(t *testing.T) {
	e := usernsEnv(t, 2)
	e.create(e.spec("s1"))
	// The refill makes a namespace ahead with the last free slot; take it out of the pool, as
	// if it were still being made.
	var p pooledUserns
	select {
	case p = <-e.r.nsReady:
	case <-time.After(10 * time.Second):
		t.Fatal("the pool made no namespace ahead")
	}
	e.r.nsMaking.Add(1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		e.r.nsReady <- p
		e.r.nsMaking.Add(-1)
		select {
		case e.r.nsMade <- struct{}{}:
		default:
		}
	}()
	b := e.create(e.spec("s2"))
	if b.HostUID != e.r.slotBase(p.slot) {
		t.Errorf("s2 runs as host uid %d, want the pooled namespace's %d", b.HostUID, e.r.slotBase(p.slot))
	}
}
