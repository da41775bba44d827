package cgroups

import (
	"os"
	"slices"
	"testing"
)

func TestCgroup2Mount(t *testing.T) {
	const systemd = `24 30 0:22 / /sys/kernel/security rw,nosuid,nodev,noexec,relatime shared:7 - securityfs securityfs rw
29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`
	const hybrid = `33 25 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
34 33 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw
35 33 0:30 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,memory
`
	const bind = `40 30 0:26 /corral /mnt/cg rw,relatime - cgroup2 cgroup2 rw,favordynmods
`
	for _, tc := range []struct {
		name, text string
		mp         string
		pass       []string
		ok         bool
	}{
		{"systemd", systemd, "/sys/fs/cgroup", []string{"nsdelegate", "memory_recursiveprot"}, true},
		{"hybrid", hybrid, "/sys/fs/cgroup/unified", nil, true},
		{"a bind of a sub-tree is not the hierarchy", bind, "", nil, false},
		{"v2 before a bind of it", systemd + bind, "/sys/fs/cgroup", []string{"nsdelegate", "memory_recursiveprot"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mp, opts, ok := cgroup2Mount([]byte(tc.text))
			if ok != tc.ok || mp != tc.mp {
				t.Fatalf("cgroup2Mount = %q, %v; want %q, %v", mp, ok, tc.mp, tc.ok)
			}
			if got := reconfigureOptions(opts); !slices.Equal(got, tc.pass) {
				t.Errorf("options given again = %q, want %q", got, tc.pass)
			}
		})
	}
}

// TestFavorDynMods turns the option on and checks the hierarchy kept its other options. Turning
// it on changes the host until it reboots, so the test does only with CORRAL_TEST_FAVORDYNMODS=1
// or where it is on already (then it reconfigures the hierarchy with the options it has). The
// e2e tests' `corral up` turns it on by default anyway.
func TestFavorDynMods(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it reconfigures the host's cgroup v2 hierarchy")
	}
	before, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	mp0, opts0, ok := cgroup2Mount(before)
	if !ok {
		t.Skip("no cgroup v2 hierarchy on this host")
	}
	if !slices.Contains(opts0, favorDynMods) && os.Getenv("CORRAL_TEST_FAVORDYNMODS") != "1" {
		t.Skip("favordynmods is off here, and turning it on lasts until reboot: CORRAL_TEST_FAVORDYNMODS=1 allows it")
	}
	mp, changed, err := FavorDynMods()
	if err != nil {
		t.Fatalf("FavorDynMods: %v", err)
	}
	if mp != mp0 || changed == slices.Contains(opts0, favorDynMods) {
		t.Errorf("FavorDynMods = %q, changed %v; the hierarchy at %s had %q", mp, changed, mp0, opts0)
	}
	after, _ := os.ReadFile("/proc/self/mountinfo")
	_, opts, _ := cgroup2Mount(after)
	for _, o := range opts0 {
		if !slices.Contains(opts, o) {
			t.Errorf("option %s lost: %q → %q", o, opts0, opts)
		}
	}
	if !slices.Contains(opts, favorDynMods) {
		t.Errorf("options %q lack %s", opts, favorDynMods)
	}
	if _, changed, err := FavorDynMods(); changed || err != nil {
		t.Errorf("second FavorDynMods: changed %v, %v; want nothing to do", changed, err)
	}
	// A reconfiguration with the options it has (what FavorDynMods does, with one more) keeps
	// them all: on a host where the option was on before, this is the path that runs.
	if err := reconfigure(mp, reconfigureOptions(opts)); err != nil {
		t.Fatalf("reconfigure with its own options: %v", err)
	}
	again, _ := os.ReadFile("/proc/self/mountinfo")
	if _, now, _ := cgroup2Mount(again); !slices.Equal(now, opts) {
		t.Errorf("options %q after reconfiguring with them, were %q", now, opts)
	}
}
