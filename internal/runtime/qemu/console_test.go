package qemu

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestCapConsole: a console log past its cap keeps its tail in console.log.1, and the writer's
// next append (QEMU's chardev opens it O_APPEND) lands at the start of the emptied file, with
// no hole before it.
func TestCapConsole(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	w, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	first := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	if _, err := w.Write(first); err != nil {
		t.Fatal(err)
	}
	if err := capConsole(path, 4096); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("after the cap\n")); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	if string(got) != "after the cap\n" {
		t.Errorf("console.log after the cap = %q (%d bytes), want only the new line", got[:min(len(got), 32)], len(got))
	}
	old, _ := os.ReadFile(path + ".1")
	if !bytes.Equal(old, first[len(first)-4096:]) {
		t.Errorf("console.log.1 holds %d bytes, want the last 4096 of the output", len(old))
	}
}

// TestQEMUMemoryLimit: the limit is the guest's memory plus a bounded overhead, more under TCG.
func TestQEMUMemoryLimit(t *testing.T) {
	kvm, tcg := qemuMemoryLimit(1<<30, AccelKVM, tcgCacheMiB, 0), qemuMemoryLimit(1<<30, AccelTCG, tcgCacheMiB, 0)
	if kvm <= 1<<30 || kvm > 1<<30+128<<20 {
		t.Errorf("KVM limit for 1 GiB = %d, want the guest plus at most 128 MiB", kvm)
	}
	if tcg != kvm+tcgCacheMiB<<20 {
		t.Errorf("TCG limit = %d, want KVM's %d plus the translation cache", tcg, kvm)
	}
}
