package qemu

import (
	"slices"
	"testing"

	"github.com/corral-dev/corral/internal/runtime"
)

// TestForkShape: a fork's copy has its source's command line but for its name; a copy of
// another size, device set or accelerator differs, so its memory image would not load.
func TestForkShape(t *testing.T) {
	r := &Runtime{accel: AccelTCG}
	spec := runtime.Spec{ID: "src", CPUs: 2, MemoryBytes: 256 << 20}
	files := []vmFile{{Role: "layer", Serial: "l0"}, {Role: "upper", Serial: "upper"}, {Role: "upper-ro", Serial: "upper"},
		{Role: "tap"}, {Role: "kernel"}, {Role: "initrd"}, {Role: "config"}, {Role: "console"}, {Role: "qmp"}, {Role: "ctl"}}
	src := r.args(&spec, files, false)
	cp := spec
	cp.ID = "copy"
	if got := r.args(&cp, files, false); !sameShape(src, got) || slices.Equal(src, got) {
		t.Fatalf("a copy's command line %q against its source's %q: want the same but for the name", got, src)
	}
	bigger := cp
	bigger.MemoryBytes = 512 << 20
	if sameShape(src, r.args(&bigger, files, false)) {
		t.Error("a copy with more memory has its source's shape")
	}
	if sameShape(src, r.args(&cp, slices.Delete(slices.Clone(files), 3, 4), false)) {
		t.Error("a copy without a network card has its source's shape")
	}
	kvm := &Runtime{accel: AccelKVM}
	if sameShape(src, kvm.args(&cp, files, false)) {
		t.Error("a copy under KVM has the shape of a source under TCG")
	}
}
