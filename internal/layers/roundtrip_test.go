//go:build linux

package layers

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// capNetRaw is a VFS_CAP_REVISION_2 security.capability value granting cap_net_raw+ep.
var capNetRaw = []byte{0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

// buildRichTree fills root with every kind of entry a layer keeps, with varied owners, modes,
// times and names. It needs root.
func buildRichTree(t *testing.T, root string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	p := func(rel string) string { return filepath.Join(root, rel) }
	mkdir := func(rel string, mode os.FileMode, uid, gid int) {
		must(os.MkdirAll(p(rel), 0o755))
		must(os.Chown(p(rel), uid, gid))
		must(os.Chmod(p(rel), mode))
	}
	write := func(rel string, data []byte, mode os.FileMode, uid, gid int) {
		must(os.WriteFile(p(rel), data, 0o600))
		must(os.Chown(p(rel), uid, gid))
		must(os.Chmod(p(rel), mode))
	}
	mkdir("bin", 0o755, 0, 0)
	mkdir("etc", 0o750, 0, 42)
	mkdir("home/user", 0o700, 1000, 1000)
	mkdir("tmp", 0o777|os.ModeSticky, 0, 0)
	mkdir("shared", 0o775|os.ModeSetgid, 0, 100)
	mkdir("run", 0o755, 0, 0)
	mkdir("opq", 0o755, 0, 0)
	mkdir("dev", 0o755, 0, 0)
	mkdir("z", 0o755, 0, 0)
	mkdir(strings.Repeat("deep/", 150)+"end", 0o755, 0, 0)

	write("bin/busybox", random(200<<10), 0o755, 0, 0)
	write("bin/su", random(1000), 0o755|os.ModeSetuid, 0, 0)
	write("bin/wall", random(1000), 0o755|os.ModeSetgid, 0, 5)
	write("bin/ping", random(3000), 0o755, 0, 0)
	must(unix.Setxattr(p("bin/ping"), "security.capability", capNetRaw, 0))
	write("etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644, 0, 0)
	write("etc/shadow", []byte("root:*:19000::::::\n"), 0o640, 0, 42)
	write("home/user/.profile", []byte("export PS1='$ '\n"), 0o644, 1000, 1000)
	write("empty", nil, 0o600, 0, 0)
	write("big", random(3<<20), 0o644, 0, 0)
	write("sp ace", []byte("1"), 0o644, 0, 0)
	write("new\nline", []byte("2"), 0o644, 0, 0)
	write("\xff\xfe", []byte("3"), 0o644, 0, 0)
	write("ünïcödé", []byte("4"), 0o644, 0, 0)
	write(strings.Repeat("n", 255), []byte("5"), 0o644, 0, 0)
	write(strings.Repeat("deep/", 150)+"end/leaf", []byte("6"), 0o644, 0, 0)
	write("zero-mode", []byte("7"), 0, 0, 0)
	write("z/orig", []byte("linked from a later-sorting name"), 0o644, 7, 7)
	must(unix.Setxattr(p("etc/passwd"), "user.comment", []byte("hello"), 0))
	must(unix.Setxattr(p("home/user"), "user.binary", []byte{0, 1, 2, 255}, 0))
	must(unix.Setxattr(p("etc/passwd"), "trusted.other", []byte("not a layer's"), 0)) // not kept

	must(os.Link(p("bin/busybox"), p("bin/ls")))
	must(os.Link(p("bin/busybox"), p("bin/cat")))
	must(os.Link(p("z/orig"), p("a-link")))

	must(os.Symlink("busybox", p("bin/sh")))
	must(os.Symlink("/usr/share/zoneinfo/UTC", p("etc/localtime")))
	must(os.Symlink("../../../../..", p("home/user/up")))
	must(os.Symlink("/etc/passwd", p("dangling-abs")))
	must(unix.Lchown(p("home/user/up"), 1000, 1000))

	must(unix.Mkfifo(p("run/fifo"), 0o600))
	must(os.Chmod(p("run/fifo"), 0o640))
	must(unix.Mknod(p("dev/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(os.Chmod(p("dev/null"), 0o666))
	must(unix.Mknod(p("gone"), unix.S_IFCHR, 0)) // a whiteout, as in an overlay upper dir
	must(unix.Setxattr(p("opq"), opaqueXattr, []byte("y"), 0))
	write("opq/kept", []byte("8"), 0o644, 0, 0)

	// Times last: creating entries changes their directories' mtimes.
	i := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		i++
		mt := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(i) * 97 * time.Minute).Add(123456789)
		ts := []unix.Timespec{unix.NsecToTimespec(mt.UnixNano()), unix.NsecToTimespec(mt.UnixNano())}
		return unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW)
	})
	must(err)
}

func writeTar(t testing.TB, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteTar(context.Background(), dir, &buf); err != nil {
		t.Fatalf("WriteTar: %v", err)
	}
	return buf.Bytes()
}

// TestRoundTrip: WriteTar of a directory, imported, gives back the same tree and digest; exported
// again it gives the same bytes; the same content imported again, in any compression, is a no-op.
func TestRoundTrip(t *testing.T) {
	requireRoot(t)
	src := filepath.Join(t.TempDir(), "src")
	buildRichTree(t, src)
	want, err := digestTree(context.Background(), src, nil)
	if err != nil {
		t.Fatal(err)
	}

	archive := writeTar(t, src)
	if again := writeTar(t, src); !bytes.Equal(archive, again) {
		t.Fatal("WriteTar of the same tree gave different bytes")
	}

	s := newStore(t, Config{AllowDevices: true, SetID: SetIDKeep})
	blob := importBytes(t, s, archive)
	if blob.Digest != want.Digest || blob.Size != want.Size || blob.Files != want.Files {
		t.Errorf("imported blob = %+v; want %+v (the source tree's)", blob, want)
	}
	layer, err := mounted(t, s, blob.Digest)
	if err != nil {
		t.Fatal(err)
	}
	wantSnap := snapshot(t, src)
	delete(wantSnap, "etc/passwd") // its trusted.other xattr is not a layer's; compare it apart
	gotSnap := snapshot(t, layer)
	if !strings.Contains(gotSnap["etc/passwd"], `xattr:user.comment="hello"`) || strings.Contains(gotSnap["etc/passwd"], "trusted") {
		t.Errorf("etc/passwd = %s; want user.comment and no trusted.* xattr", gotSnap["etc/passwd"])
	}
	delete(gotSnap, "etc/passwd")
	diffSnapshots(t, gotSnap, wantSnap)

	if exported := writeTar(t, layer); !bytes.Equal(exported, archive) {
		t.Error("WriteTar of the imported layer differs from the archive it came from")
		diffArchives(t, exported, archive)
	}
	if err := s.Verify(context.Background(), blob.Digest); err != nil {
		t.Errorf("Verify: %v", err)
	}

	for name, b := range map[string][]byte{"plain": archive, "gzip": gzipOf(t, archive), "zstd": zstdOf(t, archive)} {
		if got := importBytes(t, s, b); got != blob {
			t.Errorf("re-import (%s) = %+v; want %+v", name, got, blob)
		}
	}
	if n := blobCount(t, s); n != 1 {
		t.Errorf("%d blobs after importing the same content 4 times; want 1", n)
	}
	assertClean(t, s)
	if list, err := s.List(context.Background()); err != nil || len(list) != 1 || list[0] != blob {
		t.Errorf("List = %+v, %v; want [%+v]", list, err, blob)
	}
}

// TestVerifyDetectsChanges: a layer's mount is read-only, and an image changed in the blob store
// after import fails Verify.
func TestVerifyDetectsChanges(t *testing.T) {
	s := newStore(t, Config{})
	ctx := context.Background()
	blob := importBytes(t, s, tarOf(t, dir("d/"), file("d/f", "content")))
	if err := s.Verify(ctx, blob.Digest); err != nil {
		t.Fatalf("Verify of a fresh layer: %v", err)
	}
	layer, _ := mounted(t, s, blob.Digest)
	if err := os.WriteFile(filepath.Join(layer, "d/f"), []byte("tampered"), 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write into a mounted layer = %v; want EROFS", err)
	}
	img, err := s.blobs.(localFiles).LocalPath(imageKey(strings.TrimPrefix(blob.Image, "sha256:")))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(img, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("tampered"), blob.ImageSize-8)
	f.Close()
	err = s.Verify(ctx, blob.Digest)
	if err == nil || !strings.Contains(err.Error(), "hashes to") {
		t.Errorf("Verify after tampering = %v; want an image hash mismatch", err)
	}
}

// TestDigestIgnoresOrderAndTimes: the canonical form does not depend on entry order, mtimes,
// user names or listed-vs-implicit parents.
func TestDigestIgnoresOrderAndTimes(t *testing.T) {
	s := newStore(t, Config{})
	a := importBytes(t, s, tarOf(t, dir("d/"), file("d/f", "x"), file("g", "y")))
	later := ent{name: "d/f", body: "x", mtime: time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)}
	b := importBytes(t, s, tarOf(t, file("g", "y"), later))
	if a.Digest != b.Digest {
		t.Errorf("digests differ for the same content in another order and with other times: %s, %s", a.Digest, b.Digest)
	}
	c := importBytes(t, s, tarOf(t, dir("d/"), file("d/f", "x"), ent{name: "g", body: "y", mode: 0o600}))
	if c.Digest == a.Digest {
		t.Error("a mode change did not change the digest")
	}
	if a.Files != 3 || a.Size != 2 {
		t.Errorf("blob = %+v; want 3 files, 2 bytes", a)
	}
}

func TestDuplicates(t *testing.T) {
	cases := []struct {
		name     string
		archive  []ent
		sameAs   []ent // an archive that must give the same digest
		needRoot bool
	}{
		{"later file wins", []ent{file("f", "one"), file("f", "two")}, []ent{file("f", "two")}, false},
		{"later symlink wins", []ent{symlink("s", "a"), symlink("s", "b")}, []ent{symlink("s", "b")}, false},
		{"directories merge, later metadata wins",
			[]ent{dir("d/"), file("d/f", "x"), {name: "d/", typ: tar.TypeDir, mode: 0o700}},
			[]ent{{name: "d/", typ: tar.TypeDir, mode: 0o700}, file("d/f", "x")}, false},
		{"file replaces a hardlinked name only",
			[]ent{file("a", "one"), hardlink("b", "a"), file("b", "two")},
			[]ent{file("a", "one"), file("b", "two")}, false},
		{"repeated hardlink", []ent{file("a", "1"), hardlink("b", "a"), hardlink("b", "a")},
			[]ent{file("a", "1"), hardlink("b", "a")}, false},
		{"hardlink to itself is a no-op", []ent{file("a", "1"), hardlink("a", "a")}, []ent{file("a", "1")}, false},
		{"entry after its whiteout wins", []ent{file(".wh.f", ""), file("f", "x")}, []ent{file("f", "x")}, true},
		{"whiteout after its entry loses", []ent{file("f", "x"), file(".wh.f", "")}, []ent{file("f", "x")}, true},
		// A directory made again after its whiteout in the same layer is new: opaque (OCI).
		{"directory replaces a whiteout", []ent{file(".wh.d", ""), file("d/f", "x")}, []ent{opaqueDir("d/"), file("d/f", "x")}, true},
		{"implicit parent equals a listed 0755 one", []ent{file("a/b/c", "x")}, []ent{dir("a/"), dir("a/b/"), file("a/b/c", "x")}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.needRoot {
				requireRoot(t)
			}
			s := newStore(t, Config{})
			got := importBytes(t, s, tarOf(t, tc.archive...))
			want := importBytes(t, s, tarOf(t, tc.sameAs...))
			if got.Digest != want.Digest {
				layer, _ := mounted(t, s, got.Digest)
				wantLayer, _ := mounted(t, s, want.Digest)
				diffSnapshots(t, snapshot(t, layer), snapshot(t, wantLayer))
			}
		})
	}
}

func TestSetIDAndDevices(t *testing.T) {
	requireRoot(t)
	archive := tarOf(t,
		ent{name: "suid", mode: 0o4755},
		ent{name: "sgid", mode: 0o2711},
		ent{name: "sgid-dir/", typ: tar.TypeDir, mode: 0o2775},
		ent{name: "sticky/", typ: tar.TypeDir, mode: 0o1777},
		ent{name: "null", typ: tar.TypeChar, major: 1, minor: 3, mode: 0o666},
		ent{name: "loop0", typ: tar.TypeBlock, major: 7, minor: 0, mode: 0o660},
		ent{name: "fifo", typ: tar.TypeFifo, mode: 0o4644},
	)
	for _, tc := range []struct {
		setID string
		want  map[string]string
	}{
		{SetIDStrip, map[string]string{"suid": "reg mode=0755", "sgid": "reg mode=0711", "sgid-dir": "dir mode=2775",
			"sticky": "dir mode=1777", "null": "char mode=0666", "loop0": "block mode=0660", "fifo": "fifo mode=0644"}},
		{SetIDKeep, map[string]string{"suid": "reg mode=4755", "sgid": "reg mode=2711", "sgid-dir": "dir mode=2775",
			"fifo": "fifo mode=4644"}},
	} {
		t.Run(tc.setID, func(t *testing.T) {
			s := newStore(t, Config{SetID: tc.setID, AllowDevices: true})
			layer, _ := mounted(t, s, importBytes(t, s, archive).Digest)
			snap := snapshot(t, layer)
			for name, want := range tc.want {
				if !strings.HasPrefix(snap[name], want) {
					t.Errorf("%s = %q; want prefix %q", name, snap[name], want)
				}
			}
			if !strings.Contains(snap["null"], "rdev=1:3") || !strings.Contains(snap["loop0"], "rdev=7:0") {
				t.Errorf("devices = %q, %q; want rdev 1:3 and 7:0", snap["null"], snap["loop0"])
			}
		})
	}
}

// TestSymlinkTargetsKept: absolute and upward symlink targets are legal in a rootfs and are stored
// as written, and the files behind them are untouched.
func TestSymlinkTargetsKept(t *testing.T) {
	s := newStore(t, Config{})
	targets := map[string]string{"bin/sh": "busybox", "etc/localtime": "/usr/share/zoneinfo/UTC",
		"up": "../../../..", "self": "self", "abs-etc": "/etc"}
	var ents []ent
	for name, target := range targets {
		ents = append(ents, symlink(name, target))
	}
	layer, _ := mounted(t, s, importBytes(t, s, tarOf(t, ents...)).Digest)
	for name, want := range targets {
		if got, err := os.Readlink(filepath.Join(layer, name)); err != nil || got != want {
			t.Errorf("readlink %s = %q, %v; want %q", name, got, err, want)
		}
	}
}

// TestXattrsAndTimes checks that kept attributes and times arrive, on every kind of entry, and
// that no privilege does: security.capability goes with setuid (kept only with SetIDKeep), other
// security.* and trusted.* attributes are dropped.
func TestXattrsAndTimes(t *testing.T) {
	requireRoot(t)
	for _, setID := range []string{SetIDStrip, SetIDKeep} {
		t.Run(setID, func(t *testing.T) {
			mt := time.Date(2019, 5, 6, 7, 8, 9, 500, time.UTC)
			s := newStore(t, Config{SetID: setID})
			archive := tarOf(t,
				ent{name: "d/", typ: tar.TypeDir, mtime: mt, xattrs: map[string]string{"user.a": "1", "trusted.md5sum": "x"}},
				ent{name: "d/f", body: "x", mtime: mt, xattrs: map[string]string{"user.b": "2", "security.capability": string(capNetRaw),
					"security.selinux": "system_u:object_r:bin_t:s0", "security.ima": "\x01", "trusted.other": "t"}},
				ent{name: "d/s", typ: tar.TypeSymlink, link: "f", mtime: mt},
				ent{name: "d/p", typ: tar.TypeFifo, mtime: mt},
			)
			layer, _ := mounted(t, s, importBytes(t, s, archive).Digest)
			snap := snapshot(t, layer)
			want := map[string][]string{"d": {`xattr:user.a="1"`}, "d/f": {`xattr:user.b="2"`}}
			if setID == SetIDKeep {
				want["d/f"] = append(want["d/f"], `xattr:security.capability=`)
			}
			for name, want := range want {
				for _, w := range want {
					if !strings.Contains(snap[name], w) {
						t.Errorf("%s = %s; want it to contain %s", name, snap[name], w)
					}
				}
			}
			for _, name := range []string{"d", "d/f"} {
				for _, bad := range []string{"selinux", "security.ima", "trusted"} {
					if strings.Contains(snap[name], bad) {
						t.Errorf("%s kept %s: %s", name, bad, snap[name])
					}
				}
			}
			// On the mounted image itself, not only in what snapshot() reads.
			if _, err := unix.Getxattr(filepath.Join(layer, "d/f"), "security.capability", make([]byte, 64)); (err == nil) != (setID == SetIDKeep) {
				t.Errorf("getxattr security.capability on d/f: %v with SetID %s", err, setID)
			}
			for _, name := range []string{"d", "d/f", "d/s", "d/p"} {
				var st unix.Stat_t
				if err := unix.Lstat(filepath.Join(layer, name), &st); err != nil {
					t.Fatal(err)
				}
				if got := time.Unix(st.Mtim.Sec, st.Mtim.Nsec); !got.Equal(mt) {
					t.Errorf("mtime of %s = %v; want %v", name, got.UTC(), mt)
				}
			}
		})
	}
}

func TestConcurrentImportsOfSameContent(t *testing.T) {
	s := newStore(t, Config{})
	archive := tarOf(t, dir("d/"), file("d/a", strings.Repeat("a", 100000)), file("d/b", "b"))
	var wg sync.WaitGroup
	digests := make([]string, 6)
	for i := range digests {
		wg.Go(func() {
			blob, err := s.ImportTar(context.Background(), bytes.NewReader(archive))
			if err != nil {
				t.Errorf("import %d: %v", i, err)
			}
			digests[i] = blob.Digest
		})
	}
	wg.Wait()
	for _, d := range digests {
		if d != digests[0] {
			t.Errorf("digests differ: %v", digests)
		}
	}
	if n := blobCount(t, s); n != 1 {
		t.Errorf("%d blobs; want 1", n)
	}
	assertClean(t, s)
}

// diffArchives reports the first differing headers of two archives.
func diffArchives(t *testing.T, got, want []byte) {
	t.Helper()
	gr, wr := tar.NewReader(bytes.NewReader(got)), tar.NewReader(bytes.NewReader(want))
	for {
		g, gerr := gr.Next()
		w, werr := wr.Next()
		if gerr != nil || werr != nil {
			t.Errorf("end: got %v, want %v", gerr, werr)
			return
		}
		if g.Name != w.Name || g.Mode != w.Mode || g.Uid != w.Uid || g.Gid != w.Gid || !g.ModTime.Equal(w.ModTime) ||
			g.Typeflag != w.Typeflag || g.Linkname != w.Linkname || g.Size != w.Size || g.Format != w.Format {
			t.Errorf("header:\n got %+v\nwant %+v", g, w)
			return
		}
	}
}

// opaqueDir is dir(name) marked opaque.
func opaqueDir(name string) ent {
	d := dir(name)
	d.xattrs = map[string]string{opaqueXattr: "y"}
	return d
}
