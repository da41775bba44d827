package inroot

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/corral-dev/corral/internal/doccheck"
	"github.com/corral-dev/corral/internal/errdefs"
)

func TestDocComments(t *testing.T) { doccheck.Exported(t, ".") }

func TestMkdir(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	for _, l := range []struct{ name, target string }{
		{"proc", "/proc"}, {"up", "../../.."}, {"out", outside}, {"abs", "/var"},
	} {
		if err := os.Symlink(l.target, filepath.Join(root, l.name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(root, "var"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Without follow, every symlink on the way is refused and nothing is made anywhere.
	for _, p := range []string{"/proc", "/proc/x", "/up/x", "/out/x", "/abs/srv", "/file/x"} {
		if err := Mkdir(root, p, false); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Mkdir(%s, no follow) = %v, want invalid", p, err)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("made %v outside the root", ents)
	}
	if err := Mkdir(root, "/a/b/c", false); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(root, "a/b/c")); err != nil || !st.IsDir() || st.Mode().Perm() != 0o755 {
		t.Fatalf("made %v, %v", st, err)
	}
	// With follow, symlinks resolve as the sandbox sees them: inside the root.
	if err := Mkdir(root, "/abs/srv", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "var/srv")); err != nil {
		t.Fatalf("the working directory under an absolute symlink: %v", err)
	}
	if err := Mkdir(root, "/up/escaped", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "escaped")); err != nil {
		t.Fatalf("../../.. resolves to the root's /: %v", err)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("made %v outside the root", ents)
	}
	if err := Mkdir(root, "/a/b/c", true); err != nil {
		t.Fatalf("an existing directory: %v", err)
	}
}

func TestCheckLayers(t *testing.T) {
	bottom, top := t.TempDir(), t.TempDir()
	host := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(bottom, "data/sub"), 0o755))
	must(os.MkdirAll(filepath.Join(bottom, "opt"), 0o755))
	must(os.MkdirAll(filepath.Join(top, "opt"), 0o755))
	must(os.Symlink(host, filepath.Join(bottom, "hostlink")))
	must(os.Symlink("/proc", filepath.Join(top, "proc-link")))
	must(os.Symlink("/", filepath.Join(top, "opt/x")))
	must(os.MkdirAll(filepath.Join(host, "inside"), 0o755))
	must(os.WriteFile(filepath.Join(top, "file"), nil, 0o644))
	if err := unixMknodWhiteout(filepath.Join(top, "data")); err != nil {
		t.Skipf("make a whiteout (needs CAP_MKNOD): %v", err)
	}
	lower := []string{bottom, top}
	for _, tc := range []struct {
		p   string
		bad bool
	}{
		{"/new/dir", false},
		{"/data/sub", false}, // whited out above: absent, so made fresh
		{"/opt", false},
		{"/opt/x", true},
		{"/opt/x/y", true},
		{"/proc-link", true},
		{"/hostlink", true},
		{"/hostlink/inside", true},
		{"/file", true},
		{"/file/x", true},
	} {
		err := CheckLayers(lower, tc.p)
		if tc.bad != (err != nil) || err != nil && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("CheckLayers(%s) = %v, want bad=%v", tc.p, err, tc.bad)
		}
	}
}
