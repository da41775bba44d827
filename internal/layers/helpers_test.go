//go:build linux

package layers

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/blobstore"
	"github.com/corral-dev/corral/internal/erofs"
)

// ent is one entry of a test archive. Zero fields get defaults: a regular file, mode 0644 (0755
// for directories), owned by the test's own user, mtime 2024-01-02.
type ent struct {
	name   string
	typ    byte
	body   string
	link   string
	mode   int64
	uid    int
	gid    int
	owned  bool // use uid and gid as given, even when zero
	major  int64
	minor  int64
	xattrs map[string]string
	mtime  time.Time
}

var testTime = time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)

func dir(name string) ent              { return ent{name: name, typ: tar.TypeDir} }
func file(name, body string) ent       { return ent{name: name, typ: tar.TypeReg, body: body} }
func symlink(name, target string) ent  { return ent{name: name, typ: tar.TypeSymlink, link: target} }
func hardlink(name, target string) ent { return ent{name: name, typ: tar.TypeLink, link: target} }

func (e ent) header() *tar.Header {
	h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode,
		Uid: os.Getuid(), Gid: os.Getgid(), ModTime: e.mtime, Devmajor: e.major, Devminor: e.minor}
	if h.Typeflag == 0 {
		h.Typeflag = tar.TypeReg
	}
	if e.owned {
		h.Uid, h.Gid = e.uid, e.gid
	}
	if h.Mode == 0 {
		h.Mode = 0o644
		if h.Typeflag == tar.TypeDir {
			h.Mode = 0o755
		}
	}
	if h.ModTime.IsZero() {
		h.ModTime = testTime
	}
	if h.ModTime.Nanosecond() != 0 {
		h.Format = tar.FormatPAX // the only format that keeps sub-second times
	}
	if h.Typeflag == tar.TypeReg {
		h.Size = int64(len(e.body))
	}
	for k, v := range e.xattrs {
		if h.PAXRecords == nil {
			h.PAXRecords = map[string]string{}
		}
		h.PAXRecords["SCHILY.xattr."+k] = v
	}
	return h
}

// tarOf builds a plain tar archive.
func tarOf(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		if err := tw.WriteHeader(e.header()); err != nil {
			t.Fatalf("write header %q: %v", e.name, err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatalf("write body %q: %v", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gzipOf(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func zstdOf(t testing.TB, b []byte) []byte {
	t.Helper()
	zw, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer zw.Close()
	return zw.EncodeAll(b, nil)
}

// needEROFS skips a test that needs to build and mount EROFS images when this host cannot.
func needEROFS(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("layer store tests mount EROFS images: run them as root")
	}
	if _, err := erofs.Version(); err != nil {
		t.Skipf("layer store tests need mkfs.erofs: %v", err)
	}
}

// dirBlobs is a directory blob store in a fresh directory.
func dirBlobs(t testing.TB) blobstore.Store {
	t.Helper()
	b, err := blobstore.Open(context.Background(), "dir:"+filepath.Join(t.TempDir(), "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// newStore opens a store in a fresh directory, over a fresh directory blob store unless cfg
// names one.
func newStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	needEROFS(t)
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join(t.TempDir(), "layers")
	}
	if cfg.Blobs == nil {
		cfg.Blobs = dirBlobs(t)
	}
	s, err := Open(cfg, nil)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// mounted mounts a stored layer until the test ends and returns its directory.
func mounted(t testing.TB, s *Store, digest string) (string, error) {
	t.Helper()
	p, err := s.Acquire(context.Background(), digest)
	if err == nil {
		t.Cleanup(func() { s.Release(digest) })
	}
	return p, err
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: sets ownership, trusted.* xattrs, whiteout devices or mounts")
	}
}

// importBytes imports b and fails the test on error.
func importBytes(t testing.TB, s *Store, b []byte) Blob {
	t.Helper()
	blob, err := s.ImportTar(context.Background(), bytes.NewReader(b))
	if err != nil {
		t.Fatalf("ImportTar: %v", err)
	}
	return blob
}

// assertClean checks that no import is left half-done: staging is empty, the store directory
// holds only its layout, and every image in the blob store is named by a record.
func assertClean(t testing.TB, s *Store) {
	t.Helper()
	staged, err := os.ReadDir(s.stagingDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(staged) != 0 {
		t.Errorf("staging has %d leftovers, first %q; want none", len(staged), staged[0].Name())
	}
	top, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range top {
		if !slices.Contains([]string{"lock", "staging", "images", "mnt", "lazy"}, e.Name()) {
			t.Errorf("store directory has unexpected entry %q", e.Name())
		}
	}
	ctx := context.Background()
	blobs, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	named := s.namedKeys(ctx, blobs)
	for _, prefix := range []string{imagePrefix, dataPrefix, tablePrefix} {
		objs, err := s.blobs.List(ctx, prefix)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range objs {
			if !named[in.Key] {
				t.Errorf("%s in the blob store has no record", in.Key)
			}
		}
	}
}

func blobCount(t testing.TB, s *Store) int {
	t.Helper()
	blobs, err := s.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(blobs)
}

// snapshot renders every entry of a tree, with the mtime to the second (WriteTar's precision),
// for comparing trees.
// Whiteouts render as their type only: their mode, owner and times mean nothing.
func snapshot(t testing.TB, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	links := map[fileID]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if isWhiteout(&st) {
			out[rel] = "whiteout"
			return nil
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%s mode=%04o uid=%d gid=%d mtime=%d", typeName(st.Mode&unix.S_IFMT), st.Mode&0o7777, st.Uid, st.Gid, st.Mtim.Sec)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			fmt.Fprintf(&b, " size=%d sha=%s", len(data), hex.EncodeToString(sum[:8]))
		case unix.S_IFLNK:
			target, _ := os.Readlink(p)
			fmt.Fprintf(&b, " -> %q", target)
		case unix.S_IFCHR, unix.S_IFBLK:
			fmt.Fprintf(&b, " rdev=%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
		}
		if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			id := fileID{st.Dev, st.Ino}
			if first, ok := links[id]; ok {
				fmt.Fprintf(&b, " link=%s", first)
			} else {
				links[id] = rel
			}
		}
		dirfd, err := unix.Open(filepath.Dir(p), unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		xs, err := readXattrs(dirfd, filepath.Base(p))
		unix.Close(dirfd)
		if err != nil {
			return err
		}
		for _, x := range xs {
			fmt.Fprintf(&b, " xattr:%s=%q", x.name, x.value)
		}
		out[rel] = b.String()
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", root, err)
	}
	return out
}

// diffSnapshots reports the differences between two snapshots.
func diffSnapshots(t testing.TB, got, want map[string]string) {
	t.Helper()
	for k, w := range want {
		if g, ok := got[k]; !ok {
			t.Errorf("%q missing; want %s", k, w)
		} else if g != w {
			t.Errorf("%q:\n got %s\nwant %s", k, g, w)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%q unexpected: %s", k, g)
		}
	}
}
