//go:build linux

package layers

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

// fuzzHoneypot is a fixed directory that seed archives point symlinks and hardlinks at, so that
// mutations of them keep aiming at a place the fuzz target watches.
var fuzzHoneypot = filepath.Join(os.TempDir(), "corral-layers-fuzz-honeypot")

// FuzzImportTar feeds arbitrary bytes to ImportTar and checks that it never panics, never writes
// outside the store, never leaves staging behind, refuses with a classified error, and that
// whatever it accepts verifies against its own digest.
//
//	go test -run '^$' -fuzz FuzzImportTar -fuzztime 60s ./internal/layers
func FuzzImportTar(f *testing.F) {
	hp := fuzzHoneypot
	seeds := [][]ent{
		{dir("a/"), file("a/b", "hello"), symlink("a/s", "b"), hardlink("a/h", "a/b")},
		{symlink("a", hp), file("a/passwd", "x")},
		{symlink("a", "../../.."), file("a/x", "x")},
		{file("../x", "x"), file("/abs", "y")},
		{hardlink("h", hp+"/secret"), hardlink("i", "../../x")},
		{file(".wh.x", ""), dir("d/"), file("d/.wh..wh..opq", ""), file("d/y", "y")},
		{file("f", "1"), file("f", "2"), dir("f/")},
		{ent{name: "dev", typ: tar.TypeChar, major: 1, minor: 3}, ent{name: "fifo", typ: tar.TypeFifo}},
		{ent{name: "x", xattrs: map[string]string{"user.a": "b", "trusted.overlay.redirect": "/"}}},
		{ent{name: "suid", mode: 0o4755}, ent{name: "./", typ: tar.TypeDir, mode: 0o700}},
	}
	for _, s := range seeds {
		b := tarOf(f, s...)
		f.Add(b)
		f.Add(gzipOf(f, b))
		f.Add(zstdOf(f, b))
	}
	f.Add([]byte{})
	f.Add([]byte("not a tar"))

	if err := os.MkdirAll(hp, 0o700); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		parent := t.TempDir()
		cfg := Config{Dir: filepath.Join(parent, "layers"), MaxBytes: 8 << 20, MaxEntries: 2000, RatioFloor: 1 << 20, MaxRatio: 100}
		s := newStore(t, cfg)
		blob, err := s.ImportTar(context.Background(), bytes.NewReader(data))
		refused := errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, errdefs.ErrTooLarge)
		// Without root, chown, mknod and trusted.* fail with EPERM; that is the test's limit.
		if err != nil && !refused && !(os.Geteuid() != 0 && errors.Is(err, os.ErrPermission)) {
			t.Errorf("unclassified error: %v", err)
		}
		if err == nil {
			if verr := s.Verify(context.Background(), blob.Digest); verr != nil {
				t.Errorf("accepted blob does not verify: %v", verr)
			}
		}
		assertClean(t, s)
		if left, _ := os.ReadDir(hp); len(left) != 0 {
			t.Fatalf("the archive wrote %q into the honeypot", left[0].Name())
		}
		top, _ := os.ReadDir(parent)
		if len(top) != 1 || top[0].Name() != "layers" {
			t.Fatalf("the archive wrote next to the store: %v", top)
		}
	})
}
