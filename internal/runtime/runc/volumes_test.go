package runc

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime"
)

func TestCheckVolumePath(t *testing.T) {
	for _, tc := range []struct {
		p  string
		ok bool
	}{
		{"/data", true}, {"/home/agent/.cache", true}, {"/process", true}, {"/devices", true},
		{"", false}, {"data", false}, {"/", false}, {"/data/", false}, {"/a/../b", false}, {"//a", false},
		{"/proc", false}, {"/proc/1", false}, {"/dev", false}, {"/dev/shm", false}, {"/sys/fs", false},
		{"/.corral-agent", false}, {"/.corral-calls/x", false}, {"/etc/resolv.conf", false}, {"/etc/hosts", false},
		{"/a,b", false}, {"/a:b", false},
	} {
		err := runtime.CheckVolumePath("path", tc.p)
		if tc.ok != (err == nil) || err != nil && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("CheckVolumePath(%q) = %v, want ok=%v", tc.p, err, tc.ok)
		}
	}
	if err := checkVolumes([]runtime.Volume{{Image: "/i", Path: "/a"}, {Image: "/j", Path: "/a/b"}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("nested volume paths: %v", err)
	}
}

// TestRenderVolumes: each volume is a bind entry of its own, after every other entry (nothing
// mounts over it), read-only ones with ro.
func TestRenderVolumes(t *testing.T) {
	tmpl, err := newTemplate(nil, false, false)
	if err != nil {
		t.Fatal(err)
	}
	s := resolved(Spec{ID: "x", Lower: []string{t.TempDir()}, AgentPath: "/a", ResolvConf: "/r",
		Volumes: []runtime.Volume{{Image: "/v/a.ext4", Path: "/data"}, {Image: "/v/b.ext4", Path: "/ro", ReadOnly: true}}})
	if err := s.normalize(1 << 20); err != nil {
		t.Fatal(err)
	}
	b, err := tmpl.render(&s, "/corral/x", nil, nil, nil, Budgets{}, volumeMounts("/state/x", &s)...)
	if err != nil {
		t.Fatal(err)
	}
	var got specs.Spec
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	n := len(got.Mounts)
	rw, ro := got.Mounts[n-2], got.Mounts[n-1]
	if rw.Destination != "/data" || rw.Source != "/state/x/vol/0" || rw.Type != "bind" || slices.Contains(rw.Options, "ro") {
		t.Errorf("rw volume entry %+v", rw)
	}
	if ro.Destination != "/ro" || ro.Source != "/state/x/vol/1" || !slices.Contains(ro.Options, "ro") || !slices.Contains(ro.Options, "nosuid") {
		t.Errorf("ro volume entry %+v", ro)
	}
}
