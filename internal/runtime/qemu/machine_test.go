package qemu

import (
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/runtime"
)

// TestMachineArgs: a vm is a q35 machine with a screen, a keyboard and a tablet, its disk a qcow2
// overlay on the image (never a backing file the image names), the agent's disk, and no host path
// on QEMU's command line.
func TestMachineArgs(t *testing.T) {
	r := testRuntime(t)
	spec := runtime.Spec{ID: "sb-vm", MemoryBytes: 1 << 30, CPUs: 2, BootDisk: "/layers/x/disk.qcow2", BootDiskFormat: "qcow2",
		Netns: "/run/netns/x", Addr: netip.MustParseAddr("10.0.0.2"), Gateway: netip.MustParseAddr("10.0.0.1")}
	dir := filepath.Join(r.cfg.StateDir, spec.ID)
	files := []vmFile{{Role: "disk-base", Path: spec.BootDisk, Serial: "qcow2"}, {Role: "disk", Path: dir + "/disk.qcow2"},
		{Role: "disk-ro", Path: dir + "/disk.qcow2"}, {Role: "agent-disk", Path: "/cache/agent.img"}, {Role: "tap"},
		{Role: "machine-config", Path: dir + "/machine.json"}, {Role: "console", Path: dir + "/console.log"},
		{Role: "qmp", Path: dir + "/qmp.sock"}, {Role: "ctl", Path: dir + "/ctl.sock"}}
	args := r.machineArgs(&spec, files)
	line := strings.Join(args, " ")
	for _, want := range []string{"-M q35", "-m 1024", "-smp 2", "-vga std", "-display none", "usb-tablet",
		`"backing":null`, `"backing":"base"`, `"read-only":true`, "virtio-blk-pci,drive=disk,bootindex=1",
		"serial=" + AgentDiskSerial, "romfile=", "name=opt/corral/machine,file=/proc/self/fd/",
		"-add-fd fd=4,set=2", "-add-fd fd=5,set=2", "name=corral.ctl", "-name corral-sb-vm",
		"-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"} {
		if !strings.Contains(line, want) {
			t.Errorf("args lack %q:\n%s", want, line)
		}
	}
	for _, a := range args {
		if strings.Contains(a, dir) || strings.Contains(a, "/layers/") || strings.Contains(a, "/cache/") {
			t.Errorf("args name a host path: %q", a)
		}
	}
	if slices.Contains(args, "-kernel") || slices.Contains(args, "-no-reboot") {
		t.Errorf("a vm boots its own disk through its firmware and may reboot: %s", line)
	}
	// A raw image has no backing option at all.
	files[0].Serial = "raw"
	if line := strings.Join(r.machineArgs(&spec, files), " "); !strings.Contains(line, `"driver":"raw","file":"base-file"`) {
		t.Errorf("raw base: %s", line)
	}
}

func TestValidateMachine(t *testing.T) {
	r := testRuntime(t)
	for _, tc := range []struct {
		spec runtime.Spec
		want string
	}{
		{runtime.Spec{ID: "a", Runtime: "gvisor"}, "this backend runs"},
		{resolved(runtime.Spec{ID: "a", BootDisk: "/d", MemoryBytes: 128 << 20}), "256 MiB"},
		{runtime.Spec{ID: "a", BootDisk: "/d", Template: true}, "templates"},
		{runtime.Spec{ID: "a", BootDisk: "/d", Calls: true}, "no fncalls"},
	} {
		err := r.validate(&tc.spec)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("validate(%+v) = %v; want an error with %q", tc.spec, err, tc.want)
		}
	}
	s := runtime.Spec{ID: "a", BootDisk: "/d"}
	if err := r.validate(&s); err == nil || s.MemoryBytes != 0 {
		t.Errorf("validate without limits: %v, memory %d; want an error and no default", err, s.MemoryBytes)
	}
	s = resolved(runtime.Spec{ID: "a", BootDisk: "/d"})
	if err := r.validate(&s); err != nil {
		t.Errorf("validate(%+v): %v", s, err)
	}
}

func TestTextKeys(t *testing.T) {
	keys, err := textKeys("aZ1 >\n")
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"a"}, {"shift", "z"}, {"1"}, {"spc"}, {"shift", "dot"}, {"ret"}}
	if !slices.EqualFunc(keys, want, slices.Equal) {
		t.Errorf("textKeys = %v; want %v", keys, want)
	}
	for _, bad := range []string{"é", "\x00", "\x1b"} {
		if _, err := textKeys(bad); err == nil {
			t.Errorf("textKeys(%q) typed an untypeable character", bad)
		}
	}
}

func TestParseCombo(t *testing.T) {
	for in, want := range map[string][]string{
		"ctrl+alt+t": {"ctrl", "alt", "t"}, "Enter": {"ret"}, "super": {"meta_l"}, "F2": {"f2"},
		"shift+Tab": {"shift", "tab"}, "+": {"shift", "equal"}, "ctrl+/": {"ctrl", "slash"},
	} {
		got, err := parseCombo(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("parseCombo(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "ctrl+", "ctrl++t", "hyper", "a+b+c+d+e+f+g+h+i"} {
		if _, err := parseCombo(bad); err == nil {
			t.Errorf("parseCombo(%q) accepted", bad)
		}
	}
}

func TestCheckInput(t *testing.T) {
	down := true
	ok := []runtime.InputEvent{{Type: "text", Text: "hi"}, {Type: "key", Key: "ret"}, {Type: "move", X: 1, Y: 2},
		{Type: "click", X: 3, Y: 4, Button: "right", Count: 2}, {Type: "scroll", Delta: -3}, {Type: "button", Down: &down}}
	if err := checkInput(ok); err != nil {
		t.Fatalf("checkInput(valid) = %v", err)
	}
	for _, bad := range [][]runtime.InputEvent{
		nil,
		{{Type: "jump"}},
		{{Type: "text", Text: "ü"}},
		{{Type: "key", Key: "nope"}},
		{{Type: "click", X: -1}},
		{{Type: "click", Button: "fourth"}},
		{{Type: "scroll"}},
		{{Type: "button"}},
		{{Type: "text", Text: strings.Repeat("a", MaxInputText+1)}},
		make([]runtime.InputEvent, MaxInputEvents+1),
	} {
		if err := checkInput(bad); err == nil {
			t.Errorf("checkInput(%+v) accepted", bad)
		}
	}
	if absAxis(0, 800) != 0 || absAxis(799, 800) != 0x7fff || absAxis(5000, 800) != 0x7fff {
		t.Errorf("absAxis does not span the tablet's axis")
	}
}

func TestPNGSize(t *testing.T) {
	b := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00\x02\xd0\x00\x00\x01\x90")
	if w, h, err := pngSize(b); err != nil || w != 720 || h != 400 {
		t.Errorf("pngSize = %d, %d, %v", w, h, err)
	}
	if _, _, err := pngSize([]byte("GIF89a")); err == nil {
		t.Errorf("pngSize accepted a GIF")
	}
}
