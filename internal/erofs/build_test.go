//go:build linux

package erofs

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/doccheck"
	"github.com/corral-dev/corral/internal/errdefs"
)

func TestDocComments(t *testing.T) { doccheck.Exported(t, ".") }

func TestVersion(t *testing.T) {
	requireMkfs(t)
	v, err := Version()
	if err != nil || v == "" || !strings.ContainsAny(v[:1], "0123456789") {
		t.Fatalf("Version() = %q, %v; want a version number", v, err)
	}
	t.Logf("mkfs.erofs %s", v)
}

func TestVersionAtLeast(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want bool
	}{
		{"1.5", false}, {"1.8", false}, {"1.8.4", false}, {"1.8.5", true}, {"1.8.10", true},
		{"1.9", true}, {"1.10.1-g1234abc", true}, {"2.0", true}, {"", false}, {"x.y", false},
	} {
		if got := versionAtLeast(tc.v, 1, 8, 5); got != tc.want {
			t.Errorf("versionAtLeast(%q, 1.8.5) = %v, want %v", tc.v, got, tc.want)
		}
	}
}

// plainTree makes a small tree any user can build an image of.
func plainTree(t *testing.T, dir, content string) {
	t.Helper()
	for _, d := range []string{"a", "a/b"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, body := range map[string]string{"a/f": content, "a/b/g": strings.Repeat(content, 5000), "top": ""} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// readUUID returns the filesystem UUID from an image's superblock.
func readUUID(t *testing.T, image string) []byte {
	t.Helper()
	b, err := os.ReadFile(image)
	if err != nil {
		t.Fatal(err)
	}
	if binary.LittleEndian.Uint32(b[sbOffset:]) != sbMagic {
		t.Fatalf("%s: no EROFS superblock", image)
	}
	return b[sbUUIDOff : sbUUIDOff+16]
}

// TestBuildDeterministic: the same tree gives the same bytes; different trees get different
// UUIDs; the UUID is a version 8 UUID, never nil.
func TestBuildDeterministic(t *testing.T) {
	requireMkfs(t)
	dir := t.TempDir()
	src1, src2 := filepath.Join(dir, "src1"), filepath.Join(dir, "src2")
	for src, content := range map[string]string{src1: "one", src2: "two"} {
		if err := os.Mkdir(src, 0o755); err != nil {
			t.Fatal(err)
		}
		plainTree(t, src, content)
	}
	// Same mtimes everywhere, so that only content differs between src1 and src2.
	mt := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, src := range []string{src1, src2} {
		filepath.Walk(src, func(p string, _ os.FileInfo, _ error) error { return os.Chtimes(p, mt, mt) })
	}
	ctx := context.Background()
	img := func(name, src string) string {
		p := filepath.Join(dir, name)
		if err := Build(ctx, src, p); err != nil {
			t.Fatalf("Build %s: %v", name, err)
		}
		return p
	}
	a, b, c := img("a.erofs", src1), img("b.erofs", src1), img("c.erofs", src2)
	ab, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	if !bytes.Equal(ab, bb) {
		t.Errorf("two builds of one tree differ")
	}
	ua, uc := readUUID(t, a), readUUID(t, c)
	if bytes.Equal(ua, make([]byte, 16)) || ua[6]>>4 != 8 || ua[8]>>6 != 2 {
		t.Errorf("UUID %x: want a non-nil version 8 UUID", ua)
	}
	if bytes.Equal(ua, uc) {
		t.Errorf("images of different trees share UUID %x", ua)
	}
	if fi, err := os.Stat(a); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("image mode: %v, %v; want 0600", fi.Mode(), err)
	}
}

// noLeftovers fails if dir holds anything but the names in keep.
func noLeftovers(t *testing.T, dir string, keep ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !strings.Contains(strings.Join(keep, "\x00")+"\x00", e.Name()+"\x00") {
			t.Errorf("left behind in %s: %s", dir, e.Name())
		}
	}
}

// TestBuildFailures: each failure has its kind, names the image, and leaves nothing behind.
func TestBuildFailures(t *testing.T) {
	requireMkfs(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	plainTree(t, src, "x")
	out := t.TempDir()
	existing := filepath.Join(out, "existing.erofs")
	if err := os.WriteFile(existing, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	for _, tc := range []struct {
		name string
		ctx  context.Context
		src  string
		dst  string
		kind error
	}{
		{"src missing", context.Background(), filepath.Join(dir, "nope"), filepath.Join(out, "a.erofs"), errdefs.ErrNotFound},
		{"src is a file", context.Background(), filepath.Join(src, "top"), filepath.Join(out, "a.erofs"), errdefs.ErrInvalid},
		{"dst exists", context.Background(), src, existing, errdefs.ErrConflict},
		{"ctx cancelled", cancelled, src, filepath.Join(out, "a.erofs"), context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Build(tc.ctx, tc.src, tc.dst)
			if !errors.Is(err, tc.kind) {
				t.Fatalf("Build: %v; want %v", err, tc.kind)
			}
			if !strings.Contains(err.Error(), tc.dst) {
				t.Errorf("error %q does not name the image", err)
			}
			noLeftovers(t, out, "existing.erofs")
		})
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep me" {
		t.Errorf("existing dst was changed")
	}
}

// fakeMkfs points Build at a shell script for the rest of the test.
func fakeMkfs(t *testing.T, script string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "mkfs.erofs")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+script), 0o755); err != nil {
		t.Fatal(err)
	}
	old := mkfsName
	mkfsName = p
	t.Cleanup(func() { mkfsName = old })
}

// TestBuildToolFailures runs Build against stand-ins for mkfs.erofs that fail in the ways the real
// one can: missing, exiting non-zero after writing part of the image, hanging until cancelled.
func TestBuildToolFailures(t *testing.T) {
	src := t.TempDir()
	plainTree(t, src, "x")

	t.Run("missing", func(t *testing.T) {
		old := mkfsName
		mkfsName = "/nonexistent/mkfs.erofs"
		defer func() { mkfsName = old }()
		out := t.TempDir()
		err := Build(context.Background(), src, filepath.Join(out, "a.erofs"))
		if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "install erofs-utils") {
			t.Fatalf("Build: %v; want ErrUnavailable saying to install erofs-utils", err)
		}
		if _, err := Version(); !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("Version: %v; want ErrUnavailable", err)
		}
		noLeftovers(t, out)
	})
	t.Run("fails", func(t *testing.T) {
		// The image path is the argument before the last.
		fakeMkfs(t, `for a; do img=$out; out=$a; done; echo partial > "$img"; echo "boom: disk on fire" >&2; exit 1`)
		out := t.TempDir()
		err := Build(context.Background(), src, filepath.Join(out, "a.erofs"))
		if err == nil || !strings.Contains(err.Error(), "boom: disk on fire") {
			t.Fatalf("Build: %v; want the tool's stderr in the error", err)
		}
		noLeftovers(t, out)
	})
	t.Run("cancelled midway", func(t *testing.T) {
		fakeMkfs(t, `for a; do img=$out; out=$a; done; echo partial > "$img"; exec sleep 60`)
		out := t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := Build(ctx, src, filepath.Join(out, "a.erofs"))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Build: %v; want context.DeadlineExceeded", err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("Build took %v after cancellation", d)
		}
		noLeftovers(t, out)
	})
	t.Run("not an erofs image", func(t *testing.T) {
		fakeMkfs(t, `for a; do img=$out; out=$a; done; head -c 8192 /dev/zero > "$img"`)
		out := t.TempDir()
		err := Build(context.Background(), src, filepath.Join(out, "a.erofs"))
		if err == nil || !strings.Contains(err.Error(), "bad magic") {
			t.Fatalf("Build: %v; want a bad magic error", err)
		}
		noLeftovers(t, out)
	})
}

// TestBuildNameLimits: a 255-byte name (the Linux maximum) and a path near PATH_MAX. erofs-utils
// before 1.8.5 cannot store 255-byte names; Build must say so and leave nothing behind.
func TestBuildNameLimits(t *testing.T) {
	requireMkfs(t)
	v, _ := Version()

	t.Run("255-byte name", func(t *testing.T) {
		src, out := t.TempDir(), t.TempDir()
		if err := os.WriteFile(filepath.Join(src, strings.Repeat("n", 255)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		err := Build(context.Background(), src, filepath.Join(out, "a.erofs"))
		if versionAtLeast(v, 1, 8, 5) {
			if err != nil {
				t.Fatalf("Build with mkfs.erofs %s: %v", v, err)
			}
			return
		}
		if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "1.8.5") {
			t.Fatalf("Build with mkfs.erofs %s: %v; want ErrUnavailable naming the fixed release", v, err)
		}
		noLeftovers(t, out)
	})
	t.Run("path over PATH_MAX", func(t *testing.T) {
		src, out := t.TempDir(), t.TempDir()
		// Build with relative paths: the absolute path of the temp dir does not count.
		rel := "."
		for len(rel) < 4200 {
			rel = filepath.Join(rel, strings.Repeat("p", 200))
		}
		if err := mkdirAllLong(src, rel); err != nil {
			t.Fatal(err)
		}
		err := Build(context.Background(), src, filepath.Join(out, "a.erofs"))
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "PATH_MAX") {
			t.Fatalf("Build: %v; want ErrInvalid about PATH_MAX", err)
		}
		noLeftovers(t, out)
	})
}

// mkdirAllLong creates rel under root one component at a time, relative to an open directory,
// because the whole path is longer than PATH_MAX.
func mkdirAllLong(root, rel string) error {
	d, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer d.Close()
	cur := "."
	for _, c := range strings.Split(rel, "/") {
		if c == "." {
			continue
		}
		if err := d.Mkdir(filepath.Join(cur, c), 0o755); err != nil {
			// os.Root resolves long paths component by component.
			return err
		}
		cur = filepath.Join(cur, c)
	}
	return nil
}
