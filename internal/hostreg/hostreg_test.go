package hostreg

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

func testRegistry(t *testing.T, host ...string) *Registry {
	t.Helper()
	r, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var ps []netip.Prefix
	for _, h := range host {
		ps = append(ps, netip.MustParsePrefix(h))
	}
	r.hostAddrs = func() []netip.Prefix { return ps }
	return r
}

func dataDir(t *testing.T) string {
	t.Helper()
	d := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestClaimsAreDistinctAndStable(t *testing.T) {
	r := testRegistry(t, "10.201.3.1/24")
	a, b := dataDir(t), dataDir(t)
	ca, err := r.Acquire(Request{DataDir: a})
	if err != nil {
		t.Fatal(err)
	}
	cb, err := r.Acquire(Request{DataDir: b})
	if err != nil {
		t.Fatal(err)
	}
	if ca.Tag == cb.Tag || ca.Pool == cb.Pool || ca.LogGroup == cb.LogGroup || ca.CgroupParent == cb.CgroupParent || ca.VMUIDBase == cb.VMUIDBase ||
		ca.SandboxUIDBase == cb.SandboxUIDBase || ca.SandboxUIDBase < SandboxUIDBase || cb.SandboxUIDBase < SandboxUIDBase {
		t.Fatalf("claims share a resource:\n%+v\n%+v", ca, cb)
	}
	for _, c := range []Claim{ca, cb} {
		if c.Pool == "10.201.0.0/16" {
			t.Fatalf("pool %s overlaps the host's 10.201.3.1/24", c.Pool)
		}
		if c.Tag == "0" || c.CgroupParent == "/corral" || c.VMUIDBase == VMUIDBase {
			t.Fatalf("a non-default data dir got the default data dir's resources: %+v", c)
		}
	}
	again, err := r.Acquire(Request{DataDir: a})
	if err != nil {
		t.Fatal(err)
	}
	if again.Tag != ca.Tag || again.Pool != ca.Pool || again.LogGroup != ca.LogGroup || again.CgroupParent != ca.CgroupParent || again.VMUIDBase != ca.VMUIDBase ||
		again.SandboxUIDBase != ca.SandboxUIDBase {
		t.Fatalf("restart got another claim:\n%+v\n%+v", ca, again)
	}
}

func TestExplicitChoicesCollide(t *testing.T) {
	r := testRegistry(t)
	a, b := dataDir(t), dataDir(t)
	if _, err := r.Acquire(Request{DataDir: a, Tag: "ab", Pool: "10.77.0.0/16", CgroupParent: "/x"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		req  Request
	}{
		{"same tag", Request{DataDir: b, Tag: "ab"}},
		{"overlapping pool", Request{DataDir: b, Pool: "10.77.4.0/24"}},
		{"containing pool", Request{DataDir: b, Pool: "10.0.0.0/8"}},
		{"same cgroup", Request{DataDir: b, CgroupParent: "/x"}},
		{"nested cgroup", Request{DataDir: b, CgroupParent: "/x/y"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := r.Acquire(c.req)
			if !errors.Is(err, errdefs.ErrConflict) {
				t.Fatalf("got %v, want a conflict naming the other data dir", err)
			}
		})
	}
	// A restart asking for another value than it holds is refused: its sandboxes use the old one.
	if _, err := r.Acquire(Request{DataDir: a, Tag: "cd"}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("changed tag on restart: %v", err)
	}
	if _, err := r.Acquire(Request{DataDir: a, Tag: "ab", Pool: "10.77.0.0/16"}); err != nil {
		t.Fatalf("same explicit choice on restart: %v", err)
	}
}

func TestBadRequests(t *testing.T) {
	r := testRegistry(t)
	d := dataDir(t)
	for _, req := range []Request{
		{DataDir: "relative"},
		{DataDir: d, Tag: "TOOLONG"},
		{DataDir: d, Pool: "fd00::/64"},
		{DataDir: d, Pool: "nonsense"},
		{DataDir: d, CgroupParent: "rel"},
		{DataDir: d, CgroupParent: "/a/../b"},
	} {
		if _, err := r.Acquire(req); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%+v: got %v, want invalid", req, err)
		}
	}
	if l, _ := r.List(); len(l) != 0 {
		t.Fatalf("a refused request left a claim: %+v", l)
	}
}

func TestGoneDataDirIsPrunedAndReleased(t *testing.T) {
	r := testRegistry(t)
	a := dataDir(t)
	ca, err := r.Acquire(Request{DataDir: a, Tag: "z"})
	if err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(a)
	b := dataDir(t)
	cb, err := r.Acquire(Request{DataDir: b, Tag: "z"})
	if err != nil {
		t.Fatalf("tag of a removed data dir still held: %v", err)
	}
	if cb.Tag != ca.Tag {
		t.Fatal("unexpected tag")
	}
	if err := r.Release(b); err != nil {
		t.Fatal(err)
	}
	if l, _ := r.List(); len(l) != 0 {
		t.Fatalf("released claim still listed: %+v", l)
	}
}

func TestConcurrentAcquiresNeverShare(t *testing.T) {
	r := testRegistry(t)
	const n = 16
	claims := make([]Claim, n)
	var wg sync.WaitGroup
	for i := range n {
		d := dataDir(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := r.Acquire(Request{DataDir: d})
			if err != nil {
				t.Error(err)
			}
			claims[i] = c
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, c := range claims {
		for _, k := range []string{"tag:" + c.Tag, "pool:" + c.Pool, "cg:" + c.CgroupParent} {
			if seen[k] {
				t.Fatalf("%s handed out twice", k)
			}
			seen[k] = true
		}
	}
}

// TestOldClaimGetsSandboxUIDs: a claim written before sandbox uid ranges existed gets one at the
// next Acquire, distinct from the others', and keeps it.
func TestOldClaimGetsSandboxUIDs(t *testing.T) {
	r := testRegistry(t)
	a, b := dataDir(t), dataDir(t)
	cb, err := r.Acquire(Request{DataDir: b})
	if err != nil {
		t.Fatal(err)
	}
	old := `{"instances":[{"data_dir":"` + a + `","tag":"zz","pool":"10.240.0.0/16","log_group":1001,"cgroup_parent":"/corral-zz","vm_uid_base":1879179264}]}`
	reg, _ := os.ReadFile(r.path())
	var f file
	if err := json.Unmarshal(reg, &f); err != nil {
		t.Fatal(err)
	}
	var o file
	if err := json.Unmarshal([]byte(old), &o); err != nil {
		t.Fatal(err)
	}
	f.Instances = append(f.Instances, o.Instances...)
	out, _ := json.Marshal(f)
	if err := os.WriteFile(r.path(), out, 0o600); err != nil {
		t.Fatal(err)
	}
	ca, err := r.Acquire(Request{DataDir: a})
	if err != nil {
		t.Fatal(err)
	}
	if ca.SandboxUIDBase == 0 || ca.SandboxUIDBase == cb.SandboxUIDBase || ca.Tag != "zz" {
		t.Fatalf("old claim: got %+v beside %+v", ca, cb)
	}
	again, err := r.Acquire(Request{DataDir: a})
	if err != nil || again.SandboxUIDBase != ca.SandboxUIDBase {
		t.Fatalf("second acquire: %+v, %v; want base %d", again, err, ca.SandboxUIDBase)
	}
}
