//go:build linux

package erofs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	goerofs "github.com/erofs/go-erofs"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

const testChunk = 65536

// randomBytes returns n bytes from a generator seeded with seed.
func randomBytes(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// bigFile is more than three chunks of random data with a partial last chunk.
var bigFile = randomBytes(7, 4*testChunk+5000)

// writeFiles creates the files in files (path to content) under dir, with their directories.
func writeFiles(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	for rel, body := range files {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// splitTree fills dir with what BuildSplit must handle: a big random file and a copy of it, small
// files, a file of zeros (full zero chunks become holes), an empty file, a hardlink, a symlink and
// xattrs. trusted.* needs root; without it the tree has user.* only.
func splitTree(t *testing.T, dir string) {
	t.Helper()
	writeFiles(t, dir, map[string][]byte{
		"big":          bigFile,
		"sub/big-copy": bigFile,
		"small":        []byte("hello\n"),
		"sub/small2":   randomBytes(8, 100),
		"page":         randomBytes(9, 4096),
		"zeros":        make([]byte, 3*testChunk+777),
		"empty":        nil,
	})
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Link(filepath.Join(dir, "small"), filepath.Join(dir, "sub/hard")))
	must(os.Symlink("../big", filepath.Join(dir, "sub/link")))
	must(unix.Setxattr(filepath.Join(dir, "big"), "user.note", []byte("big one"), 0))
	if os.Geteuid() == 0 {
		must(unix.Setxattr(filepath.Join(dir, "sub"), "trusted.overlay.opaque", []byte("y"), 0))
	}
}

// buildSplitForTest runs BuildSplit on src into dir and returns the image and blob paths.
func buildSplitForTest(t *testing.T, src, dir, name string) (string, string) {
	t.Helper()
	meta, data := filepath.Join(dir, name+".erofs"), filepath.Join(dir, name+".blob")
	start := time.Now()
	if err := BuildSplit(context.Background(), src, meta, data, testChunk); err != nil {
		t.Fatalf("BuildSplit: %v", err)
	}
	t.Logf("built %s in %v", name, time.Since(start))
	return meta, data
}

// waitLoopsGone waits for autoclear to detach the loop devices backed by files under dir; it runs
// asynchronously since Linux 5.17.
func waitLoopsGone(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(loopsBackedUnder(dir)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if devs := loopsBackedUnder(dir); len(devs) > 0 {
		t.Errorf("5 s after Unmount, loop devices still back files under %s: %v", dir, devs)
	}
}

// TestBuildSplitRoundTrip builds a split image, mounts it with its blob both ways, and compares
// the mount with the source.
func TestBuildSplitRoundTrip(t *testing.T) {
	requireAll(t)
	dir := testDir(t)
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	splitTree(t, src)
	meta, data := buildSplitForTest(t, src, dir, "layer")
	ms, _ := os.Stat(meta)
	ds, _ := os.Stat(data)
	t.Logf("meta %d bytes, data %d bytes", ms.Size(), ds.Size())
	// The copy and the zeros are deduplicated: the blob holds the big file once.
	if max := int64(len(bigFile)) + 8*4096 + 4096; ds.Size() > max {
		t.Errorf("data blob is %d bytes; want at most %d (dedup of the copy, holes for zeros)", ds.Size(), max)
	}
	for _, p := range []string{meta, data} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode: %v, %v; want 0600", p, fi.Mode(), err)
		}
	}
	noLeftovers(t, dir, "src", "layer.erofs", "layer.blob")

	for _, tc := range []struct {
		name string
		opts MountOptions
	}{
		{"file", MountOptions{Devices: []string{data}}},
		{"loop", MountOptions{Devices: []string{data}, ForceLoop: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mnt, b := mountForTest(t, meta, dir, tc.opts)
			t.Logf("backing %+v", b)
			switch {
			case tc.opts.ForceLoop:
				if b.Kind != BackingLoop || len(b.Devices) != 1 || !strings.HasPrefix(b.Devices[0], "/dev/loop") || b.Devices[0] == b.Device {
					t.Errorf("Backing = %+v; want loop devices for the image and the blob", b)
				}
				for i, dev := range append([]string{b.Device}, b.Devices...) {
					want := []string{meta, data}[i]
					if got := loopBackingFile(dev); got != want {
						t.Errorf("%s backs %q; want %q", dev, got, want)
					}
				}
			case b.Kind == BackingLoop:
				t.Logf("this kernel refused a file-backed mount; Mount fell back to loop")
			case b.Devices != nil:
				t.Errorf("Backing.Devices = %v for a file-backed mount; want nil", b.Devices)
			}
			compareTrees(t, src, mnt)
			if err := Unmount(mnt); err != nil {
				t.Fatalf("Unmount: %v", err)
			}
			if n := len(mountsAt(t, mnt)); n != 0 {
				t.Errorf("%d mounts left at %s", n, mnt)
			}
			waitLoopsGone(t, dir)
		})
	}
}

// TestBuildSplitDeterministic: the same tree gives the same bytes in both files, and two trees
// whose metadata is identical (same names, sizes and times) but whose data differs get different
// UUIDs.
func TestBuildSplitDeterministic(t *testing.T) {
	requireMkfs(t)
	dir := t.TempDir()
	src1, src2 := filepath.Join(dir, "src1"), filepath.Join(dir, "src2")
	writeFiles(t, src1, map[string][]byte{"a/f": randomBytes(1, 70000), "g": []byte("one")})
	writeFiles(t, src2, map[string][]byte{"a/f": randomBytes(2, 70000), "g": []byte("two")})
	mt := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, src := range []string{src1, src2} {
		filepath.Walk(src, func(p string, _ os.FileInfo, _ error) error { return os.Chtimes(p, mt, mt) })
	}
	m1, d1 := buildSplitForTest(t, src1, dir, "one")
	m2, d2 := buildSplitForTest(t, src1, dir, "two")
	m3, _ := buildSplitForTest(t, src2, dir, "three")
	for _, pair := range [][2]string{{m1, m2}, {d1, d2}} {
		a, _ := os.ReadFile(pair[0])
		b, _ := os.ReadFile(pair[1])
		if !bytes.Equal(a, b) {
			t.Errorf("two builds of one tree differ: %s and %s", pair[0], pair[1])
		}
	}
	u1, u3 := readUUID(t, m1), readUUID(t, m3)
	if bytes.Equal(u1, make([]byte, 16)) || u1[6]>>4 != 8 || u1[8]>>6 != 2 {
		t.Errorf("UUID %x: want a non-nil version 8 UUID", u1)
	}
	if bytes.Equal(u1, u3) {
		t.Errorf("images of trees with different data share UUID %x", u1)
	}
	// The point of hashing the blob too: without the UUID, the two images are the same bytes.
	a, _ := os.ReadFile(m1)
	c, _ := os.ReadFile(m3)
	copy(a[sbUUIDOff:], make([]byte, 16))
	copy(c[sbUUIDOff:], make([]byte, 16))
	copy(a[sbChecksumOff:], make([]byte, 4))
	copy(c[sbChecksumOff:], make([]byte, 4))
	t.Logf("images equal but for UUID and checksum: %v", bytes.Equal(a, c))
}

// TestBuildSplitFailures: each failure has its kind, names the image, and leaves nothing at
// either destination or beside it.
func TestBuildSplitFailures(t *testing.T) {
	requireMkfs(t)
	src := t.TempDir()
	plainTree(t, src, "x")
	metaDir, dataDir := t.TempDir(), t.TempDir()
	meta, data := filepath.Join(metaDir, "m.erofs"), filepath.Join(dataDir, "d.blob")
	existing := filepath.Join(dataDir, "existing")
	if err := os.WriteFile(existing, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	bg := context.Background()

	for _, tc := range []struct {
		name       string
		ctx        context.Context
		src        string
		meta, data string
		chunk      int64
		kind       error
	}{
		{"chunk 0", bg, src, meta, data, 0, errdefs.ErrInvalid},
		{"chunk 2048", bg, src, meta, data, 2048, errdefs.ErrInvalid},
		{"chunk not a power of two", bg, src, meta, data, 3 * 4096, errdefs.ErrInvalid},
		{"chunk too big", bg, src, meta, data, 2 << 30, errdefs.ErrInvalid},
		{"meta is data", bg, src, meta, filepath.Join(metaDir, ".", "m.erofs"), 4096, errdefs.ErrInvalid},
		{"src missing", bg, filepath.Join(src, "nope"), meta, data, 4096, errdefs.ErrNotFound},
		{"data exists", bg, src, meta, existing, 4096, errdefs.ErrConflict},
		{"meta exists", bg, src, existing, data, 4096, errdefs.ErrConflict},
		{"ctx cancelled", cancelled, src, meta, data, 4096, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := BuildSplit(tc.ctx, tc.src, tc.meta, tc.data, tc.chunk)
			if !errors.Is(err, tc.kind) {
				t.Fatalf("BuildSplit: %v; want %v", err, tc.kind)
			}
			if !strings.Contains(err.Error(), tc.meta) {
				t.Errorf("error %q does not name the image", err)
			}
			noLeftovers(t, metaDir)
			noLeftovers(t, dataDir, "existing")
		})
	}
	t.Run("tool fails", func(t *testing.T) {
		fakeMkfs(t, `for a; do img=$out; out=$a; done; echo partial > "$img"; echo "boom: disk on fire" >&2; exit 1`)
		err := BuildSplit(bg, src, meta, data, 4096)
		if err == nil || !strings.Contains(err.Error(), "boom: disk on fire") {
			t.Fatalf("BuildSplit: %v; want the tool's stderr in the error", err)
		}
		noLeftovers(t, metaDir)
		noLeftovers(t, dataDir, "existing")
	})
	if b, _ := os.ReadFile(existing); string(b) != "keep me" {
		t.Errorf("existing file was changed")
	}
}

// extents returns the blob extents of every regular file in the split image, by path.
func extents(t *testing.T, meta, data string) map[string][]goerofs.DataRange {
	t.Helper()
	mf, err := os.Open(meta)
	if err != nil {
		t.Fatal(err)
	}
	defer mf.Close()
	df, err := os.Open(data)
	if err != nil {
		t.Fatal(err)
	}
	defer df.Close()
	fsys, err := goerofs.Open(mf, goerofs.WithExtraDevices(df))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]goerofs.DataRange{}
	err = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		out[p] = fi.(interface{ DataRange() []goerofs.DataRange }).DataRange()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// checkChunks checks the units of a blob: in order, contiguous, covering it, none longer than a
// chunk, each Sum right. It also checks that the blob's bytes outside every file's extents (the
// padding after each chunk) are zeros, and returns the set of Sums.
func checkChunks(t *testing.T, meta, data string, cs []Chunk) map[[32]byte]bool {
	t.Helper()
	blob, err := os.ReadFile(data)
	if err != nil {
		t.Fatal(err)
	}
	var off int64
	sums := map[[32]byte]bool{}
	for i, c := range cs {
		if c.Off != off || c.Len <= 0 || c.Len > testChunk {
			t.Fatalf("unit %d = [%d, +%d); want it to start at %d, with 0 < length <= %d", i, c.Off, c.Len, off, testChunk)
		}
		if sha256.Sum256(blob[c.Off:c.Off+c.Len]) != c.Sum {
			t.Errorf("unit %d [%d, +%d): wrong Sum", i, c.Off, c.Len)
		}
		sums[c.Sum] = true
		off += c.Len
	}
	if off != int64(len(blob)) {
		t.Errorf("units cover [0, %d); the blob is %d bytes", off, len(blob))
	}
	used := make([]bool, len(blob))
	for _, rs := range extents(t, meta, data) {
		for _, r := range rs {
			if r.Offset >= 0 {
				for i := r.Offset; i < r.Offset+r.Size; i++ {
					used[i] = true
				}
			}
		}
	}
	var pad int
	for i, u := range used {
		if !u {
			pad++
			if blob[i] != 0 {
				t.Fatalf("byte %d of the blob, in no file's extent, is %#x; want padding of zeros", i, blob[i])
			}
		}
	}
	t.Logf("%d units over %d bytes, %d of them padding (zeros)", len(cs), len(blob), pad)
	return sums
}

// TestChunks cuts the blobs of two images holding the same big file at different places: the
// file's full chunks must be units with the same Sums in both.
func TestChunks(t *testing.T) {
	requireMkfs(t)
	dir := t.TempDir()
	src1, src2 := filepath.Join(dir, "src1"), filepath.Join(dir, "src2")
	if err := os.Mkdir(src1, 0o755); err != nil {
		t.Fatal(err)
	}
	splitTree(t, src1)
	// mkfs.erofs writes data in the order of its inodes, by name: "a*" comes before "big".
	writeFiles(t, src2, map[string][]byte{
		"a-first":   randomBytes(20, 3*testChunk+100),
		"a-small":   []byte("other"),
		"b/big":     bigFile,
		"c-after":   randomBytes(21, 10000),
		"c-partial": bigFile[:testChunk+10],
	})

	var want [][32]byte // the big file's full chunks
	for o := 0; o+testChunk <= len(bigFile); o += testChunk {
		want = append(want, sha256.Sum256(bigFile[o:o+testChunk]))
	}
	for _, tc := range []struct{ src, big string }{{src1, "big"}, {src2, "b/big"}} {
		name := filepath.Base(tc.src)
		meta, data := buildSplitForTest(t, tc.src, dir, name)
		start := time.Now()
		cs, err := Chunks(context.Background(), meta, data, testChunk)
		if err != nil {
			t.Fatalf("Chunks: %v", err)
		}
		t.Logf("%s: Chunks took %v; big file at %+v", name, time.Since(start), extents(t, meta, data)[tc.big])
		sums := checkChunks(t, meta, data, cs)
		for i, s := range want {
			if !sums[s] {
				t.Errorf("%s: full chunk %d of the big file is not a unit", name, i)
			}
		}
	}
	// Not a trivial pass: the big file lies at different blob offsets in the two images.
	e1 := extents(t, filepath.Join(dir, "src1.erofs"), filepath.Join(dir, "src1.blob"))["big"]
	e2 := extents(t, filepath.Join(dir, "src2.erofs"), filepath.Join(dir, "src2.blob"))["b/big"]
	if len(e1) == 0 || len(e2) == 0 || e1[0].Offset == e2[0].Offset {
		t.Errorf("big file extents %+v and %+v: want different offsets", e1, e2)
	}
}

// TestChunksInvalid: Chunks refuses a blob that does not match its image.
func TestChunksInvalid(t *testing.T) {
	requireMkfs(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	// A hole between two data chunks of 4 KiB: at 64 KiB the second extent is misaligned.
	page := randomBytes(3, 4096)
	writeFiles(t, src, map[string][]byte{"f": slices3(page, make([]byte, 4096), page[:100])})
	meta, data := filepath.Join(dir, "m.erofs"), filepath.Join(dir, "d.blob")
	if err := BuildSplit(context.Background(), src, meta, data, 4096); err != nil {
		t.Fatal(err)
	}
	// At the build's chunk size: the page, then the tail (padded to a page); the hole is not stored.
	if cs, err := Chunks(context.Background(), meta, data, 4096); err != nil || len(cs) != 2 {
		t.Errorf("Chunks at the build's chunk size: %+v, %v; want 2 units", cs, err)
	}
	plain := filepath.Join(dir, "plain.erofs")
	if err := Build(context.Background(), src, plain); err != nil {
		t.Fatal(err)
	}
	long := filepath.Join(dir, "long.blob")
	b, _ := os.ReadFile(data)
	if err := os.WriteFile(long, append(b, make([]byte, 4096)...), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, meta, data string
		chunk            int64
	}{
		{"chunk size not a power of two", meta, data, 5000},
		{"chunk size larger than the build's", meta, data, testChunk},
		{"blob too long", meta, long, 4096},
		{"not a split image", plain, data, 4096},
		{"blob is the image", meta, meta, 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Chunks(context.Background(), tc.meta, tc.data, tc.chunk)
			t.Logf("Chunks: %v", err)
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.data) {
				t.Errorf("Chunks: %v; want ErrInvalid naming the blob", err)
			}
		})
	}
}

func slices3(a, b, c []byte) []byte { return append(append(append([]byte{}, a...), b...), c...) }

// TestBuildSplitNoData: a tree without regular-file data gives an empty blob. The image still
// records one extra device (of zero blocks); it mounts with the empty blob, both ways, and
// without it.
func TestBuildSplitNoData(t *testing.T) {
	requireMkfs(t)
	dir := t.TempDir()
	if os.Geteuid() == 0 {
		dir = testDir(t)
	}
	src := filepath.Join(dir, "src")
	writeFiles(t, src, map[string][]byte{"d/empty": nil, "empty2": nil})
	if err := os.Symlink("d/empty", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	meta, data := buildSplitForTest(t, src, dir, "nodata")
	if fi, err := os.Stat(data); err != nil || fi.Size() != 0 {
		t.Fatalf("data blob: %v, %v; want 0 bytes", fi, err)
	}
	f, err := os.Open(meta)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := readSuper(f)
	f.Close()
	if err != nil || len(sb.devices) != 1 || sb.devices[0].blocks != 0 {
		t.Errorf("superblock %+v, %v; want one extra device of 0 blocks", sb, err)
	}
	cs, err := Chunks(context.Background(), meta, data, testChunk)
	if err != nil || len(cs) != 0 {
		t.Errorf("Chunks: %+v, %v; want no units", cs, err)
	}

	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	requireKernel(t)
	for _, opts := range []MountOptions{{Devices: []string{data}}, {Devices: []string{data}, ForceLoop: true}, {}} {
		mnt, b := mountForTest(t, meta, dir, opts)
		compareTrees(t, src, mnt)
		if err := Unmount(mnt); err != nil {
			t.Fatalf("Unmount (%+v): %v", b, err)
		}
		waitLoopsGone(t, dir)
	}
}

// TestMountDevicesErrors: a split image with missing, surplus or short devices is refused before
// the kernel sees it, with the right kind, and nothing is left mounted or attached.
func TestMountDevicesErrors(t *testing.T) {
	requireAll(t)
	dir := testDir(t)
	src := filepath.Join(dir, "src")
	writeFiles(t, src, map[string][]byte{"f": randomBytes(4, 10000)})
	meta, data := buildSplitForTest(t, src, dir, "img")
	short := filepath.Join(dir, "short.blob")
	if err := os.WriteFile(short, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(dir, "mnt")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		devs []string
		kind error
		says string
	}{
		{"no devices", nil, errdefs.ErrInvalid, "MountOptions.Devices"},
		{"two devices", []string{data, data}, errdefs.ErrInvalid, "1 extra devices, 2 given"},
		{"device missing", []string{filepath.Join(dir, "nope.blob")}, errdefs.ErrNotFound, "nope.blob"},
		{"device short", []string{short}, errdefs.ErrInvalid, "short.blob"},
		{"device a directory", []string{dir}, errdefs.ErrInvalid, "not a regular file"},
	} {
		for _, loop := range []bool{false, true} {
			_, err := Mount(meta, target, MountOptions{Devices: tc.devs, ForceLoop: loop})
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), meta) {
				t.Errorf("%s (loop %v): %v; want %v saying %q and naming the image", tc.name, loop, err, tc.kind, tc.says)
			}
			if len(mountsAt(t, target)) != 0 {
				t.Fatalf("%s: a failed Mount left a mount", tc.name)
			}
		}
	}
	// An image the kernel refuses only after Mount has attached it and its device to loop devices:
	// both must be detached again.
	bad := filepath.Join(dir, "bad.erofs")
	if err := os.WriteFile(bad, make([]byte, 16<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Mount(bad, target, MountOptions{Devices: []string{data}})
	t.Logf("Mount of a corrupt image with a device: %v", err)
	if err == nil || !strings.Contains(err.Error(), "loop") {
		t.Errorf("Mount of a corrupt image with a device: %v; want an error from the loop fallback", err)
	}
	if len(mountsAt(t, target)) != 0 {
		t.Fatalf("a failed Mount left a mount")
	}
	waitLoopsGone(t, dir)
}

// TestMountsSplit: Mounts mounts a split image with its blob, and a restarted process adopts the
// mount and unmounts it on the last Release.
func TestMountsSplit(t *testing.T) {
	requireAll(t)
	dir := testDir(t)
	src := filepath.Join(dir, "src")
	writeFiles(t, src, map[string][]byte{"big": bigFile})
	meta, data := buildSplitForTest(t, src, dir, "img")
	mdir := filepath.Join(dir, "mounts")
	old := openMounts(t, mdir)
	p, err := old.AcquireDevices(nameA, meta, []string{data})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(p, "big")); !bytes.Equal(got, bigFile) {
		t.Errorf("big file differs through the mount")
	}
	before := mountsAt(t, p)

	m := openMounts(t, mdir) // the restart: old is abandoned
	t.Cleanup(func() { sweepAll(t, m) })
	if after := mountsAt(t, p); len(after) != 1 || len(before) != 1 || after[0] != before[0] {
		t.Errorf("mounts at %s before %+v, after %+v: want the same single mount", p, before, after)
	}
	if !m.Hold(nameA) {
		t.Fatalf("Hold of an adopted split mount failed")
	}
	if got, _ := os.ReadFile(filepath.Join(p, "big")); !bytes.Equal(got, bigFile) {
		t.Errorf("big file differs through the adopted mount")
	}
	if err := m.Release(nameA); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if len(mountsAt(t, p)) != 0 {
		t.Errorf("%s still mounted after its last Release", p)
	}
	waitLoopsGone(t, dir)
}

func TestCutUnits(t *testing.T) {
	const c = 4096
	for _, tc := range []struct {
		name   string
		starts []int64
		size   int64
		want   string // "off+len" for each unit
	}{
		{"one small piece", []int64{0}, 100, "0+100"},
		{"full chunks stay alone", []int64{0, c, 2 * c}, 3 * c, "0+4096 4096+4096 8192+4096"},
		{"small pieces merge", []int64{0, 1000, 2000, 3000}, 5000, "0+3000 3000+2000"},
		{"merge up to exactly a chunk", []int64{0, 2048}, c, "0+4096"},
		{"tail, then a full chunk", []int64{0, c, c + 100, 2*c + 100}, 3*c + 100, "0+4096 4096+100 4196+4096 8292+4096"},
		{"a piece longer than a chunk is cut", []int64{0, 100}, 100 + 2*c + 5, "0+100 100+4096 4196+4096 8292+5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			us, err := cutUnits(tc.starts, tc.size, c)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, u := range us {
				got = append(got, fmt.Sprintf("%d+%d", u.Off, u.Len))
			}
			if g := strings.Join(got, " "); g != tc.want {
				t.Errorf("got %s; want %s", g, tc.want)
			}
		})
	}
}

// FuzzReadSuper: readSuper must not panic or allocate without bound on any image.
func FuzzReadSuper(f *testing.F) {
	sb := make([]byte, 4096)
	binary.LittleEndian.PutUint32(sb[sbOffset:], sbMagic)
	sb[sbBlkSzBitsOff] = 12
	binary.LittleEndian.PutUint16(sb[sbExtraDevicesOff:], 1)
	binary.LittleEndian.PutUint16(sb[sbDevtSlotOffOff:], 9)
	f.Add(sb)
	f.Fuzz(func(t *testing.T, b []byte) {
		si, err := readSuper(bytes.NewReader(b))
		if err == nil && len(si.devices) > maxExtraDevices {
			t.Errorf("%d devices", len(si.devices))
		}
	})
}
