package runc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOverlayOptionsNameNoHostPath checks that the overlay's options, which a sandbox reads in
// its mountinfo, name none of the directories it was made from, with either mount call.
func TestOverlayOptionsNameNoHostPath(t *testing.T) {
	needRoot(t)
	for name, mount := range map[string]func(string, []string, string, string) error{
		"fsconfig": func(t string, l []string, u, w string) error { return mountOverlay(t, l, u, w, nil) },
		"legacy":   mountOverlayLegacy,
	} {
		t.Run(name, func(t *testing.T) { testOverlayOptions(t, mount) })
	}
}

func testOverlayOptions(t *testing.T, mount func(string, []string, string, string) error) {
	dir := t.TempDir()
	var lower []string
	for _, d := range []string{"base", "top", "upper", "work", "root"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
		if d == "base" || d == "top" {
			lower = append(lower, filepath.Join(dir, d))
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "top", "f"), []byte("top"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root")
	if err := mount(root, lower, filepath.Join(dir, "upper"), filepath.Join(dir, "work")); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(root, unix.MNT_DETACH)
	if b, err := os.ReadFile(filepath.Join(root, "f")); err != nil || string(b) != "top" {
		t.Fatalf("read through the overlay: %q %v", b, err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[4] != root {
			continue
		}
		found = true
		_, opts, _ := strings.Cut(line, " - ")
		if strings.Contains(opts, dir) || !strings.Contains(opts, "lowerdir") {
			t.Errorf("overlay options name host paths: %s", opts)
		}
		t.Logf("options: %s", opts)
	}
	if !found {
		t.Fatalf("no mount at %s", root)
	}
}
