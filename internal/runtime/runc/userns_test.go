package runc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
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

// TestUserNSSandbox: a sandbox's root is its slot's first host uid, in a namespace that maps
// 65536 ids there and is owned by that uid; its disk stores inside ids; the namespace has the
// configured inotify budget.
func TestUserNSSandbox(t *testing.T) {
	e := usernsEnv(t, 4)
	sb := e.create(e.spec("u1"))
	if sb.HostUID < 0xF8000000 {
		t.Fatalf("HostUID = %d", sb.HostUID)
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
