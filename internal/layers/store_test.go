//go:build linux

package layers

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

var update = flag.Bool("update", false, "rewrite golden files")

func TestConfigValidate(t *testing.T) {
	b := dirBlobs(t)
	cases := []struct {
		cfg   Config
		field string
	}{
		{Config{Dir: "/var/lib/corral/layers", Blobs: b}, ""},
		{Config{Dir: "/x", Blobs: b, SetID: SetIDKeep, MaxBytes: 1, MaxEntries: 1, MaxRatio: 1}, ""},
		{Config{Dir: "/x"}, "layers.blobs"},
		{Config{Blobs: b}, "layers.dir"},
		{Config{Dir: "relative", Blobs: b}, "layers.dir"},
		{Config{Dir: "/x", Blobs: b, MaxBytes: -1}, "layers.max_bytes"},
		{Config{Dir: "/x", Blobs: b, MaxEntries: -1}, "layers.max_entries"},
		{Config{Dir: "/x", Blobs: b, MaxRatio: -1}, "layers.max_ratio"},
		{Config{Dir: "/x", Blobs: b, RatioFloor: -1}, "layers.ratio_floor"},
		{Config{Dir: "/x", Blobs: b, SetID: "drop"}, "layers.setid"},
	}
	for _, tc := range cases {
		err := tc.cfg.Validate()
		if got := errdefs.Field(err); got != tc.field {
			t.Errorf("Validate(%+v) = %v; want field %q", tc.cfg, err, tc.field)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Validate(%+v) = %v; want ErrInvalid", tc.cfg, err)
		}
	}
}

func TestOpen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "layers")
	if err := os.MkdirAll(filepath.Join(dir, "staging", "import-123", "fs", "half"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	needEROFS(t)
	blobs := dirBlobs(t)
	s, err := Open(Config{Dir: dir, Blobs: blobs}, nil)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	assertClean(t, s) // the crashed import is gone
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("store directory mode = %v, %v; want 0700", fi.Mode().Perm(), err)
	}
	if _, err := Open(Config{Dir: dir, Blobs: blobs}, nil); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second Open = %v; want ErrConflict", err)
	}
	s.Close()
	s2, err := Open(Config{Dir: dir, Blobs: blobs}, nil)
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	s2.Close()
}

func TestStatPathListRemove(t *testing.T) {
	s := newStore(t, Config{})
	a := importBytes(t, s, tarOf(t, file("a", "1")))
	b := importBytes(t, s, tarOf(t, file("b", "22")))
	list, err := s.List(context.Background())
	if err != nil || len(list) != 2 || list[0].Digest > list[1].Digest {
		t.Fatalf("List = %+v, %v; want 2 blobs sorted by digest", list, err)
	}
	if got, err := s.Stat(context.Background(), b.Digest); err != nil || got != b || got.Size != 2 || got.Files != 1 {
		t.Errorf("Stat = %+v, %v; want %+v", got, err, b)
	}
	ctx := context.Background()
	p, err := s.Acquire(ctx, a.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(p, "a")); err != nil || string(data) != "1" {
		t.Errorf("read a = %q, %v", data, err)
	}
	if err := s.Remove(ctx, a.Digest); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Remove of a mounted layer = %v; want ErrConflict", err)
	}
	if err := s.Release(a.Digest); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, a.Digest); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	for name, err := range map[string]error{
		"Acquire": func() error { _, err := s.Acquire(ctx, a.Digest); return err }(),
		"Stat":    func() error { _, err := s.Stat(context.Background(), a.Digest); return err }(),
		"Remove":  s.Remove(context.Background(), a.Digest),
		"Verify":  s.Verify(context.Background(), a.Digest),
	} {
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%s after Remove = %v; want ErrNotFound", name, err)
		}
	}
	assertClean(t, s)
	for _, bad := range []string{"", "sha256:", "sha256:../../etc", "md5:" + strings.Repeat("0", 64),
		"sha256:" + strings.Repeat("A", 64), "sha256:" + strings.Repeat("0", 63)} {
		if _, err := s.Acquire(ctx, bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Acquire(%q) = %v; want ErrInvalid", bad, err)
		}
		if err := s.Remove(context.Background(), bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Remove(%q) = %v; want ErrInvalid", bad, err)
		}
	}
}

func TestEmptyLayer(t *testing.T) {
	s := newStore(t, Config{})
	blob := importBytes(t, s, tarOf(t))
	if blob.Files != 0 || blob.Size != 0 {
		t.Errorf("empty layer = %+v; want no files", blob)
	}
}

// bigArchive is a tar of several MiB, so a failure can strike in the middle of it.
func bigArchive(t testing.TB) []byte {
	var ents []ent
	for i := range 40 {
		ents = append(ents, file(fmt.Sprintf("d%d/f%d", i%4, i), strings.Repeat(fmt.Sprint(i), 128<<10)))
	}
	return tarOf(t, ents...)
}

// cancelAfter reads r and cancels ctx once n bytes have been read.
type cancelAfter struct {
	r      io.Reader
	n      int
	cancel context.CancelFunc
}

func (c *cancelAfter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if c.n -= n; c.n <= 0 {
		c.cancel()
	}
	return n, err
}

// TestFailureLeavesNothing: cancellation before or during an import, a failing reader and a
// refusal after many good entries all leave the store as it was.
func TestFailureLeavesNothing(t *testing.T) {
	archive := bigArchive(t)
	readErr := errors.New("connection reset")
	for _, tc := range []struct {
		name    string
		run     func(s *Store) error
		wantErr error
	}{
		{"canceled before", func(s *Store) error {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_, err := s.ImportTar(ctx, bytes.NewReader(archive))
			return err
		}, context.Canceled},
		{"canceled midway", func(s *Store) error {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, err := s.ImportTar(ctx, &cancelAfter{r: bytes.NewReader(archive), n: len(archive) / 2, cancel: cancel})
			return err
		}, context.Canceled},
		{"canceled midway, zstd", func(s *Store) error {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			z := zstdOf(t, archive)
			_, err := s.ImportTar(ctx, &cancelAfter{r: iotest.HalfReader(bytes.NewReader(z)), n: len(z) / 2, cancel: cancel})
			return err
		}, context.Canceled},
		{"reader fails midway", func(s *Store) error {
			r := io.MultiReader(bytes.NewReader(archive[:len(archive)/2]), iotest.ErrReader(readErr))
			_, err := s.ImportTar(context.Background(), r)
			return err
		}, readErr},
		{"refused at the end", func(s *Store) error {
			_, err := s.ImportTar(context.Background(), bytes.NewReader(append(archive[:len(archive)-1024], tarOf(t, file("../x", ""))...)))
			return err
		}, errdefs.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, Config{})
			err := tc.run(s)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("ImportTar = %v; want %v", err, tc.wantErr)
			}
			t.Logf("error: %v", err)
			assertClean(t, s)
			if n := blobCount(t, s); n != 0 {
				t.Errorf("%d blobs; want 0", n)
			}
		})
	}
}

// TestWhiteoutConversion checks the overlayfs form of OCI whiteouts on disk.
func TestWhiteoutConversion(t *testing.T) {
	requireRoot(t)
	s := newStore(t, Config{})
	layer, _ := mounted(t, s, importBytes(t, s, tarOf(t,
		file(".wh.gone", ""), dir("d/"), file("d/.wh..wh..opq", ""), file("d/new", "n"),
		file("implicit/.wh..wh..opq", ""), file(".wh..wh.plnk", ""),
		ent{name: "literal", typ: tar.TypeChar}, // a 0:0 character device is a whiteout already
		// A directory deleted and made again in the same layer is new: opaque (OCI whiteouts).
		file(".wh.again", ""), dir("again/"), file("again/f", "x"),
		file(".wh.again2", ""), file("again2/f", "x"), // its directory implied by a file
	)).Digest)
	for _, name := range []string{"gone", "literal"} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(layer, name), &st); err != nil || !isWhiteout(&st) {
			t.Errorf("%s: %v, mode %o rdev %d; want a 0:0 character device", name, err, st.Mode, st.Rdev)
		}
	}
	for _, name := range []string{"d", "implicit", "again", "again2"} {
		v, err := lgetxattr(filepath.Join(layer, name), opaqueXattr)
		if err != nil || string(v) != "y" {
			t.Errorf("%s: %s = %q, %v; want y", name, opaqueXattr, v, err)
		}
	}
	for _, name := range []string{".wh.gone", "d/.wh..wh..opq", ".wh..wh.plnk"} {
		if _, err := os.Lstat(filepath.Join(layer, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s exists in the layer; want it converted or skipped", name)
		}
	}
}

// TestWhiteoutsHideLowerLayers mounts two imported layers with overlayfs and checks that the
// upper one's whiteouts and opaque directory hide the lower one's files.
func TestWhiteoutsHideLowerLayers(t *testing.T) {
	requireRoot(t)
	s := newStore(t, Config{})
	lower, _ := mounted(t, s, importBytes(t, s, tarOf(t,
		file("keep", "k"), file("hidden", "h"), dir("d/"), file("d/old", "o"), dir("gone-dir/"), file("gone-dir/x", "x"),
	)).Digest)
	upper, _ := mounted(t, s, importBytes(t, s, tarOf(t,
		file(".wh.hidden", ""), file(".wh.gone-dir", ""), dir("d/"), file("d/.wh..wh..opq", ""), file("d/new", "n"),
	)).Digest)
	mnt := t.TempDir()
	opts := "lowerdir=" + upper + ":" + lower
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, opts); err != nil {
		if err == unix.ENODEV {
			t.Skip("overlayfs is not available")
		}
		t.Fatalf("mount overlay %s: %v", opts, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	for name, want := range map[string]bool{"keep": true, "hidden": false, "gone-dir": false, "d/new": true, "d/old": false} {
		_, err := os.Lstat(filepath.Join(mnt, name))
		if got := err == nil; got != want {
			t.Errorf("%s visible = %v (%v); want %v", name, got, err, want)
		}
	}
}

// TestCanonicalFormGolden pins the canonical form: a change to it renames every stored layer.
// Run with -update after a deliberate change (and bump canonicalHeader).
func TestCanonicalFormGolden(t *testing.T) {
	requireRoot(t)
	s := newStore(t, Config{AllowDevices: true})
	archive := tarOf(t,
		ent{name: "./", typ: '5', mode: 0o755, owned: true},
		ent{name: "bin/", typ: '5', mode: 0o755, owned: true},
		ent{name: "bin/busybox", body: "#!busybox\n", mode: 0o755, owned: true},
		ent{name: "bin/sh", typ: '2', link: "busybox", owned: true},
		ent{name: "bin/ls", typ: '1', link: "bin/busybox"},
		ent{name: "etc/", typ: '5', mode: 0o750, uid: 0, gid: 42, owned: true},
		ent{name: "etc/passwd", body: "root:x:0:0::/root:/bin/sh\n", mode: 0o644, owned: true,
			xattrs: map[string]string{"user.b": "2", "user.a": "bin\x00ary"}},
		ent{name: "home/user/", typ: '5', mode: 0o700, uid: 1000, gid: 1000, owned: true},
		ent{name: "dev/null", typ: '3', major: 1, minor: 3, mode: 0o666, owned: true},
		ent{name: "run/fifo", typ: '6', mode: 0o600, owned: true},
		ent{name: ".wh.gone"},
		ent{name: "opq/.wh..wh..opq"},
	)
	blob := importBytes(t, s, archive)
	layer, _ := mounted(t, s, blob.Digest)
	var form bytes.Buffer
	again, err := canonicalForm(context.Background(), layer, nil, &form)
	if err != nil || again.Digest != blob.Digest || again.Size != blob.Size || again.Files != blob.Files {
		t.Fatalf("canonicalForm of the mounted image = %+v, %v; want %+v", again, err, blob)
	}
	fmt.Fprintf(&form, "# digest %s\n", blob.Digest)
	golden := filepath.Join("testdata", "canonical.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, form.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(form.Bytes(), want) {
		t.Errorf("canonical form changed:\n%s\nwant:\n%s", form.Bytes(), want)
	}
}
