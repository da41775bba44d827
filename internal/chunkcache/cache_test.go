//go:build linux

package chunkcache

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/doccheck"
	"github.com/corral-dev/corral/internal/errdefs"
)

func TestDocComments(t *testing.T) { doccheck.Exported(t, ".") }

// chunk returns test chunk i of the given size and its digest.
func chunk(i, size int) ([32]byte, []byte) {
	data := make([]byte, size)
	r := rand.New(rand.NewPCG(uint64(i), uint64(size)))
	for j := 0; j+8 <= size; j += 8 {
		binary.LittleEndian.PutUint64(data[j:], r.Uint64())
	}
	data[0] = byte(i)
	return sha256.Sum256(data), data
}

// clock is a fake clock in whole seconds, so that every filesystem keeps its times exactly.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2030, 1, 2, 3, 0, 0, 0, time.UTC)} }

func (k *clock) Now() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.t
}

func (k *clock) Advance(d time.Duration) {
	k.mu.Lock()
	k.t = k.t.Add(d)
	k.mu.Unlock()
}

// open opens a cache on dir with the fake clock and closes it when the test ends.
func open(t *testing.T, dir string, limit int64, k *clock) *Cache {
	t.Helper()
	c, err := Open(dir, limit, slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	if k != nil {
		c.now = k.Now
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// testWriter sends log lines to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

func put(t *testing.T, c *Cache, d [32]byte, data []byte) {
	t.Helper()
	if err := c.Put(d, data); err != nil {
		t.Fatalf("Put: %v", err)
	}
}

// readAll reads a whole chunk through ReadAt.
func readAll(c *Cache, d [32]byte) ([]byte, error) {
	size, ok := c.Size(d)
	if !ok {
		return nil, notFound(d)
	}
	p := make([]byte, size)
	n, err := c.ReadAt(d, p, 0)
	if err == io.EOF && int64(n) == size {
		err = nil
	}
	return p[:n], err
}

func mustRead(t *testing.T, c *Cache, d [32]byte, want []byte) {
	t.Helper()
	got, err := readAll(c, d)
	if err != nil {
		t.Fatalf("read %x: %v", d[:4], err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %x: got %d bytes that differ from the %d put", d[:4], len(got), len(want))
	}
}

func wantHas(t *testing.T, c *Cache, want map[string]bool, digests map[string][32]byte) {
	t.Helper()
	for name, d := range digests {
		if got := c.Has(d); got != want[name] {
			t.Errorf("Has(%s) = %v, want %v", name, got, want[name])
		}
		_, err := os.Stat(c.path(d))
		if onDisk := err == nil; onDisk != want[name] {
			t.Errorf("chunk %s on disk = %v, want %v", name, onDisk, want[name])
		}
	}
}

// dirEntries lists the names under dir, recursively, relative to it.
func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			names = append(names, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestPutReadAt(t *testing.T) {
	c := open(t, t.TempDir(), 1<<20, newClock())
	d, data := chunk(1, 3000)
	put(t, c, d, data)

	tests := []struct {
		off, len int
		wantN    int
		wantErr  error
	}{
		{0, 3000, 3000, nil},
		{1000, 500, 500, nil},
		{2900, 500, 100, io.EOF},
		{3000, 10, 0, io.EOF},
		{5000, 10, 0, io.EOF},
	}
	for _, tt := range tests {
		p := make([]byte, tt.len)
		n, err := c.ReadAt(d, p, int64(tt.off))
		if n != tt.wantN || err != tt.wantErr {
			t.Errorf("ReadAt(off %d, len %d) = %d, %v; want %d, %v", tt.off, tt.len, n, err, tt.wantN, tt.wantErr)
		}
		if n > 0 && !bytes.Equal(p[:n], data[tt.off:tt.off+n]) {
			t.Errorf("ReadAt(off %d, len %d): wrong bytes", tt.off, tt.len)
		}
	}
	if _, err := c.ReadAt(d, make([]byte, 1), -1); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("ReadAt at -1: %v, want ErrInvalid", err)
	}
	missing, _ := chunk(2, 3000)
	if _, err := c.ReadAt(missing, make([]byte, 1), 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ReadAt of a missing chunk: %v, want ErrNotFound", err)
	}
	if size, ok := c.Size(d); !ok || size != 3000 {
		t.Errorf("Size = %d, %v; want 3000, true", size, ok)
	}
	if c.Has(missing) {
		t.Error("Has(missing) = true")
	}

	put(t, c, d, data) // stored already: no second write
	st := c.Stats()
	if st.Puts != 1 || st.PutBytes != 3000 || st.Chunks != 1 || st.Bytes != 3000 {
		t.Errorf("Stats = %+v, want 1 put of 3000 bytes, 1 chunk of 3000 bytes", st)
	}
	fi, err := os.Stat(c.path(d))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("chunk file mode = %v, want 0600", fi.Mode().Perm())
	}
}

func TestPutRefusesBadData(t *testing.T) {
	dir := t.TempDir()
	c := open(t, dir, 4<<20, newClock())
	_, data := chunk(1, 100)
	other, _ := chunk(2, 100)
	big := make([]byte, MaxChunkSize+1)
	tests := []struct {
		name   string
		digest [32]byte
		data   []byte
	}{
		{"wrong digest", other, data},
		{"empty", sha256.Sum256(nil), nil},
		{"too large", sha256.Sum256(big), big},
	}
	for _, tt := range tests {
		if err := c.Put(tt.digest, tt.data); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: Put = %v, want ErrInvalid", tt.name, err)
		}
		if c.Has(tt.digest) {
			t.Errorf("%s: stored anyway", tt.name)
		}
	}
	if got := dirEntries(t, dir); !slices.Equal(got, []string{"lock"}) {
		t.Errorf("files after refused Puts: %q, want only lock", got)
	}
	if st := c.Stats(); st.Puts != 0 || st.Bytes != 0 {
		t.Errorf("Stats = %+v, want nothing stored", st)
	}
}

func TestRestartKeepsChunksAndOrder(t *testing.T) {
	dir := t.TempDir()
	k := newClock()
	const size = 1000
	c := open(t, dir, 3*size, k)
	digests := map[string][32]byte{}
	datas := map[string][]byte{}
	for i, n := range []string{"a", "b", "c"} {
		digests[n], datas[n] = chunk(i, size)
		put(t, c, digests[n], datas[n])
		k.Advance(time.Second)
	}
	// a is now the most recently used and b the least. The read is within a minute of the
	// Put, so only Close writes it down.
	mustRead(t, c, digests["a"], datas["a"])
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	c = open(t, dir, 3*size, k)
	if st := c.Stats(); st.Chunks != 3 || st.Bytes != 3*size {
		t.Fatalf("after reopening: Stats = %+v, want 3 chunks of %d bytes", st, size)
	}
	c.SetLimit(2 * size)
	wantHas(t, c, map[string]bool{"a": true, "c": true}, digests)
	for _, n := range []string{"a", "c"} {
		mustRead(t, c, digests[n], datas[n])
	}
}

func TestAccessTimeSavedLazily(t *testing.T) {
	k := newClock()
	c := open(t, t.TempDir(), 1<<20, k)
	d, data := chunk(1, 100)
	put(t, c, d, data)
	t0 := k.Now()
	mtime := func() time.Time {
		fi, err := os.Stat(c.path(d))
		if err != nil {
			t.Fatal(err)
		}
		return fi.ModTime()
	}
	if got := mtime(); !got.Equal(t0) {
		t.Fatalf("mtime after Put = %v, want %v", got, t0)
	}
	k.Advance(10 * time.Second)
	mustRead(t, c, d, data)
	if got := mtime(); !got.Equal(t0) {
		t.Errorf("mtime 10s after Put = %v, want it unchanged (%v)", got, t0)
	}
	k.Advance(2 * time.Minute)
	mustRead(t, c, d, data)
	if got, want := mtime(), k.Now(); !got.Equal(want) {
		t.Errorf("mtime two minutes later = %v, want %v", got, want)
	}
}

func TestCorruptChunkDetected(t *testing.T) {
	dir := t.TempDir()
	c := open(t, dir, 1<<20, newClock())
	good, goodData := chunk(1, 5000)
	flipped, flippedData := chunk(2, 5000)
	short, shortData := chunk(3, 5000)
	for d, data := range map[[32]byte][]byte{good: goodData, flipped: flippedData, short: shortData} {
		put(t, c, d, data)
	}
	c.Close()

	b := slices.Clone(flippedData)
	b[4321] ^= 0x40
	if err := os.WriteFile(c.path(flipped), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(c.path(short), 4000); err != nil {
		t.Fatal(err)
	}

	c = open(t, dir, 1<<20, newClock())
	for _, d := range [][32]byte{flipped, short} {
		if _, err := c.ReadAt(d, make([]byte, 10), 0); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("ReadAt of a corrupt chunk: %v, want ErrNotFound", err)
		}
		if c.Has(d) {
			t.Error("corrupt chunk still in the index")
		}
		if _, err := os.Stat(c.path(d)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("corrupt chunk file still there: %v", err)
		}
	}
	mustRead(t, c, good, goodData)
	if st := c.Stats(); st.CorruptDetected != 2 || st.Chunks != 1 || st.Bytes != 5000 {
		t.Errorf("Stats = %+v, want 2 corrupt, 1 chunk of 5000 bytes left", st)
	}
	// Fetched again, it is stored again.
	put(t, c, flipped, flippedData)
	mustRead(t, c, flipped, flippedData)
}

// TestConcurrentFirstReads has many readers race for the first read of chunks after a restart:
// each chunk is hashed once, and the corrupt one is counted once.
func TestConcurrentFirstReads(t *testing.T) {
	dir := t.TempDir()
	c := open(t, dir, 16<<20, nil)
	var ds [][32]byte
	var datas [][]byte
	for i := range 4 {
		d, data := chunk(i, 256<<10)
		put(t, c, d, data)
		ds = append(ds, d)
		datas = append(datas, data)
	}
	c.Close()
	b := slices.Clone(datas[0])
	b[len(b)-1] ^= 1
	if err := os.WriteFile(c.path(ds[0]), b, 0o600); err != nil {
		t.Fatal(err)
	}

	c = open(t, dir, 16<<20, nil)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for j := range len(ds) {
				i := (g + j) % len(ds)
				got, err := readAll(c, ds[i])
				switch {
				case i == 0 && !errors.Is(err, errdefs.ErrNotFound):
					t.Errorf("read of the corrupt chunk: %v, want ErrNotFound", err)
				case i != 0 && err != nil:
					t.Errorf("read of chunk %d: %v", i, err)
				case i != 0 && !bytes.Equal(got, datas[i]):
					t.Errorf("read of chunk %d: wrong bytes", i)
				}
			}
		})
	}
	wg.Wait()
	if st := c.Stats(); st.CorruptDetected != 1 || st.Chunks != 3 {
		t.Errorf("Stats = %+v, want 1 corrupt chunk and 3 left", st)
	}
}

func TestChunkFileDeletedByHand(t *testing.T) {
	c := open(t, t.TempDir(), 1<<20, newClock())
	d, data := chunk(1, 100)
	put(t, c, d, data)
	if err := os.Remove(c.path(d)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadAt(d, make([]byte, 10), 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ReadAt: %v, want ErrNotFound", err)
	}
	if st := c.Stats(); st.Chunks != 0 || st.Bytes != 0 {
		t.Errorf("Stats = %+v, want it empty", st)
	}
}

func TestEvictsLeastRecentlyUsed(t *testing.T) {
	k := newClock()
	const size = 1000
	c := open(t, t.TempDir(), 3*size, k)
	digests := map[string][32]byte{}
	datas := map[string][]byte{}
	for i, n := range []string{"a", "b", "c", "d", "e"} {
		digests[n], datas[n] = chunk(i, size)
	}
	step := func(n string) {
		put(t, c, digests[n], datas[n])
		k.Advance(time.Second)
	}
	step("a")
	step("b")
	step("c")
	mustRead(t, c, digests["a"], datas["a"])
	step("d") // evicts b
	wantHas(t, c, map[string]bool{"a": true, "c": true, "d": true}, digests)
	step("e") // evicts c
	wantHas(t, c, map[string]bool{"a": true, "d": true, "e": true}, digests)
	st := c.Stats()
	if st.Evictions != 2 || st.EvictedBytes != 2*size || st.Bytes != 3*size {
		t.Errorf("Stats = %+v, want 2 evictions of %d bytes and %d stored", st, 2*size, 3*size)
	}
}

func TestPinnedNeverEvicted(t *testing.T) {
	k := newClock()
	const size = 1000
	c := open(t, t.TempDir(), 3*size, k)
	digests := map[string][32]byte{}
	datas := map[string][]byte{}
	for i, n := range []string{"a", "b", "c", "d", "e", "f"} {
		digests[n], datas[n] = chunk(i, size)
	}
	step := func(n string) error {
		k.Advance(time.Second)
		return c.Put(digests[n], datas[n])
	}
	// e is pinned before it is stored, and a twice in one call.
	c.Pin("layer1", [][32]byte{digests["a"], digests["b"], digests["e"], digests["a"]})
	for _, n := range []string{"a", "b", "c", "d"} { // d evicts c, not the older a or b
		if err := step(n); err != nil {
			t.Fatal(err)
		}
	}
	wantHas(t, c, map[string]bool{"a": true, "b": true, "d": true}, digests)
	if err := step("e"); err != nil { // pinned on arrival; evicts d
		t.Fatal(err)
	}
	wantHas(t, c, map[string]bool{"a": true, "b": true, "e": true}, digests)
	if st := c.Stats(); st.PinnedBytes != 3*size || st.PinnedChunks != 3 {
		t.Errorf("Stats = %+v, want 3 pinned chunks", st)
	}

	// A second owner keeps a pinned after the first lets go.
	c.Pin("layer2", [][32]byte{digests["a"]})
	c.Unpin("layer1")
	if st := c.Stats(); st.PinnedChunks != 1 {
		t.Errorf("after Unpin(layer1): %d pinned chunks, want 1", st.PinnedChunks)
	}
	for _, n := range []string{"c", "d"} {
		if err := step(n); err != nil {
			t.Fatal(err)
		}
	}
	wantHas(t, c, map[string]bool{"a": true, "c": true, "d": true}, digests)
	c.Unpin("layer2")
	c.Unpin("nobody")
	if st := c.Stats(); st.PinnedChunks != 0 || st.PinnedBytes != 0 {
		t.Errorf("after unpinning all: Stats = %+v, want nothing pinned", st)
	}
}

func TestPinAddsToOwner(t *testing.T) {
	c := open(t, t.TempDir(), 1<<20, newClock())
	var ds [][32]byte
	for i := range 6 {
		d, data := chunk(i, 100)
		put(t, c, d, data)
		ds = append(ds, d)
	}
	c.Pin("o", [][32]byte{ds[4], ds[0], ds[2]})
	c.Pin("o", [][32]byte{ds[2], ds[1], ds[5], ds[0]})
	if got := c.Stats().PinnedChunks; got != 5 {
		t.Errorf("%d pinned chunks, want 5", got)
	}
	if got := c.entries[ds[2]].pins; got != 1 {
		t.Errorf("chunk pinned twice by one owner has %d pins, want 1", got)
	}
	c.Unpin("o")
	if got := c.Stats().PinnedChunks; got != 0 || len(c.pending) != 0 {
		t.Errorf("after Unpin: %d pinned chunks, %d pending pins, want none", got, len(c.pending))
	}
}

func TestFullOfPinnedRefusesPut(t *testing.T) {
	dir := t.TempDir()
	const size = 1000
	c := open(t, dir, 2*size, newClock())
	a, aData := chunk(1, size)
	b, bData := chunk(2, size)
	x, xData := chunk(3, size)
	c.Pin("layer", [][32]byte{a, b})
	put(t, c, a, aData)
	put(t, c, b, bData)

	err := c.Put(x, xData)
	if !errors.Is(err, errdefs.ErrExhausted) {
		t.Fatalf("Put into a cache full of pinned chunks: %v, want ErrExhausted", err)
	}
	t.Log(err)
	if c.Has(x) {
		t.Error("refused chunk stored anyway")
	}
	if _, err := os.Stat(c.path(x)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("refused chunk on disk: %v", err)
	}
	if tmp := dirEntries(t, filepath.Join(dir, "tmp")); len(tmp) != 0 {
		t.Errorf("temp files left: %q", tmp)
	}
	st := c.Stats()
	if st.Bypassed != 1 || st.Evictions != 0 || st.Chunks != 2 {
		t.Errorf("Stats = %+v, want 1 bypassed, no eviction, 2 chunks", st)
	}
	if err := c.Trim(); err != nil {
		t.Errorf("Trim at the limit: %v", err)
	}
	c.SetLimit(size) // cannot get there: nothing is evicted
	if err := c.Trim(); !errors.Is(err, errdefs.ErrExhausted) {
		t.Errorf("Trim over the limit with everything pinned: %v, want ErrExhausted", err)
	}
	if !c.Has(a) || !c.Has(b) {
		t.Error("pinned chunk evicted")
	}

	c.SetLimit(2 * size)
	c.Unpin("layer")
	put(t, c, x, xData)
	if st := c.Stats(); st.Chunks != 2 || st.Evictions != 1 {
		t.Errorf("after unpinning: Stats = %+v, want 2 chunks, 1 eviction", st)
	}
}

func TestTrimAndSetLimit(t *testing.T) {
	k := newClock()
	const size = 1000
	c := open(t, t.TempDir(), 4*size, k)
	var ds [][32]byte
	for i := range 4 {
		d, data := chunk(i, size)
		put(t, c, d, data)
		ds = append(ds, d)
		k.Advance(time.Second)
	}
	c.SetLimit(2 * size)
	for i, d := range ds {
		if got, want := c.Has(d), i >= 2; got != want {
			t.Errorf("after SetLimit: Has(chunk %d) = %v, want %v", i, got, want)
		}
	}
	if err := c.Trim(); err != nil {
		t.Errorf("Trim: %v", err)
	}
	c.SetLimit(0)
	if st := c.Stats(); st.Chunks != 0 || st.Bytes != 0 || st.Evictions != 4 || st.Limit != 0 {
		t.Errorf("after SetLimit(0): Stats = %+v, want empty after 4 evictions", st)
	}
	d, data := chunk(9, size)
	if err := c.Put(d, data); !errors.Is(err, errdefs.ErrExhausted) {
		t.Errorf("Put with limit 0: %v, want ErrExhausted", err)
	}
}

func TestSecondOpenConflicts(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(dir, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c2, err := Open(dir, 1<<20, nil); !errors.Is(err, errdefs.ErrConflict) {
		if c2 != nil {
			c2.Close()
		}
		t.Fatalf("second Open: %v, want ErrConflict", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	c, err = Open(dir, 1<<20, nil)
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	c.Close()
}

func TestClosedCache(t *testing.T) {
	c := open(t, t.TempDir(), 1<<20, nil)
	d, data := chunk(1, 100)
	put(t, c, d, data)
	c.Close()
	if err := c.Put(d, data); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Put after Close: %v, want ErrUnavailable", err)
	}
	if _, err := c.ReadAt(d, make([]byte, 1), 0); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("ReadAt after Close: %v, want ErrUnavailable", err)
	}
	if c.Has(d) {
		t.Error("Has after Close = true")
	}
}

func TestOpenValidates(t *testing.T) {
	if _, err := Open("", 1, nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Open(\"\"): %v, want ErrInvalid", err)
	}
	if _, err := Open(t.TempDir(), -1, nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Open with limit -1: %v, want ErrInvalid", err)
	}
}

func TestOpenCleansDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cache")
	good, goodData := chunk(1, 500)
	wrongShard, wrongData := chunk(2, 500)
	zero, _ := chunk(3, 500)
	h := func(d [32]byte) string { return hexDigest(d) }
	shard := func(d [32]byte) string { return filepath.Join(dir, "sha256", h(d)[:2]) }
	files := map[string][]byte{
		filepath.Join(dir, "tmp", "put-123"):           []byte("half a chunk"),
		filepath.Join(dir, "tmp", "put-456", "x"):      nil,
		filepath.Join(shard(good), h(good)):            goodData,
		filepath.Join(shard(good), h(wrongShard)):      wrongData,
		filepath.Join(shard(zero), h(zero)):            {},
		filepath.Join(shard(good), "notachunk"):        []byte("x"),
		filepath.Join(shard(good), "ABCD"+h(good)[4:]): goodData,
		filepath.Join(shard(good), h(good)+".tmp"):     goodData,
		filepath.Join(dir, "sha256", "README"):         []byte("x"),
		filepath.Join(dir, "sha256", "zz", "file"):     []byte("x"),
		filepath.Join(dir, "other"):                    []byte("not ours, kept"),
	}
	for p, b := range files {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A directory and a symlink with chunk names.
	dirChunk, _ := chunk(4, 500)
	if err := os.MkdirAll(filepath.Join(shard(dirChunk), h(dirChunk)), 0o700); err != nil {
		t.Fatal(err)
	}
	linkChunk, _ := chunk(5, 500)
	if err := os.MkdirAll(shard(linkChunk), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(shard(good), h(good)), filepath.Join(shard(linkChunk), h(linkChunk))); err != nil {
		t.Fatal(err)
	}

	c := open(t, dir, 1<<20, nil)
	want := []string{"lock", "other", filepath.Join("sha256", h(good)[:2], h(good))}
	if got := dirEntries(t, dir); !slices.Equal(got, want) {
		t.Errorf("after Open: files %q, want %q", got, want)
	}
	if st := c.Stats(); st.Chunks != 1 || st.Bytes != 500 {
		t.Errorf("Stats = %+v, want 1 chunk of 500 bytes", st)
	}
	mustRead(t, c, good, goodData)
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("cache directory mode %v, want 0700", fi.Mode().Perm())
	}
	for b := range 256 {
		if _, err := os.Stat(filepath.Join(dir, "sha256", fmt.Sprintf("%02x", b))); err != nil {
			t.Errorf("chunk directory missing: %v", err)
		}
	}
}

func TestOpenFilesBounded(t *testing.T) {
	c := open(t, t.TempDir(), 1<<20, newClock())
	c.maxOpen = 4
	var ds [][32]byte
	var datas [][]byte
	for i := range 10 {
		d, data := chunk(i, 200)
		put(t, c, d, data)
		ds = append(ds, d)
		datas = append(datas, data)
	}
	for round := range 2 {
		for i, d := range ds {
			mustRead(t, c, d, datas[i])
		}
		c.mu.Lock()
		open, idle := c.openFiles, c.idle.len
		c.mu.Unlock()
		if open != 4 || idle != 4 {
			t.Errorf("round %d: %d files open, %d idle; want 4 and 4", round, open, idle)
		}
	}

	// A reader holding a chunk that is removed meanwhile reads it to the end; the file is
	// closed when it lets go.
	h, err := c.acquire(ds[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(ds[0]); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 200)
	if n, err := c.read(h, p, 0); n != 200 || (err != nil && err != io.EOF) || !bytes.Equal(p, datas[0]) {
		t.Errorf("read of a chunk removed while held: %d, %v", n, err)
	}
	c.mu.Lock()
	open := c.openFiles
	c.mu.Unlock()
	if open != 3 {
		t.Errorf("%d files open after the removed chunk's reader let go, want 3", open)
	}
}

func TestConcurrentPutSameDigest(t *testing.T) {
	c := open(t, t.TempDir(), 1<<20, nil)
	d, data := chunk(1, 64<<10)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			if err := c.Put(d, data); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if st := c.Stats(); st.Puts != 1 || st.Chunks != 1 {
		t.Errorf("Stats = %+v, want 1 put, 1 chunk", st)
	}
	mustRead(t, c, d, data)
}

// TestConcurrent runs Puts, reads, pins, removals and trims at once on a cache that holds a
// quarter of the chunks and keeps 4 files open, then checks the index against the disk.
func TestConcurrent(t *testing.T) {
	dir := t.TempDir()
	const nChunks = 48
	var ds [][32]byte
	var datas [][]byte
	var total int64
	for i := range nChunks {
		d, data := chunk(i, 1000+i*97)
		ds = append(ds, d)
		datas = append(datas, data)
		total += int64(len(data))
	}
	limit := total / 4
	c := open(t, dir, limit, nil)
	c.maxOpen = 4

	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 7))
			owner := fmt.Sprint("owner", g)
			for range 300 {
				i := r.IntN(nChunks)
				switch op := r.IntN(100); {
				case op < 30:
					if err := c.Put(ds[i], datas[i]); err != nil && !errors.Is(err, errdefs.ErrExhausted) {
						t.Errorf("Put: %v", err)
					}
				case op < 85:
					off := r.IntN(len(datas[i]))
					p := make([]byte, r.IntN(2000)+1)
					n, err := c.ReadAt(ds[i], p, int64(off))
					switch {
					case errors.Is(err, errdefs.ErrNotFound):
					case err != nil && err != io.EOF:
						t.Errorf("ReadAt: %v", err)
					case !bytes.Equal(p[:n], datas[i][off:off+n]):
						t.Errorf("ReadAt of chunk %d at %d: wrong bytes", i, off)
					}
				case op < 90:
					c.Pin(owner, [][32]byte{ds[i], ds[(i+1)%nChunks]})
				case op < 95:
					c.Unpin(owner)
				case op < 97:
					if err := c.Remove(ds[i]); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
						t.Errorf("Remove: %v", err)
					}
				case op < 98:
					if err := c.Trim(); err != nil && !errors.Is(err, errdefs.ErrExhausted) {
						t.Errorf("Trim: %v", err)
					}
				default:
					c.Has(ds[i])
					c.Stats()
				}
			}
			c.Unpin(owner)
		})
	}
	wg.Wait()

	st := c.Stats()
	t.Logf("%+v", st)
	if st.Bytes > limit {
		t.Errorf("%d bytes stored, over the limit of %d", st.Bytes, limit)
	}
	if st.PinnedBytes != 0 || len(c.pending) != 0 || len(c.owners) != 0 || len(c.busy) != 0 || c.reserved != 0 {
		t.Errorf("left behind: %d pinned bytes, %d pending pins, %d owners, %d busy, %d reserved",
			st.PinnedBytes, len(c.pending), len(c.owners), len(c.busy), c.reserved)
	}
	if c.openFiles > c.maxOpen || c.openFiles != c.idle.len {
		t.Errorf("%d files open, %d idle, bound %d", c.openFiles, c.idle.len, c.maxOpen)
	}
	var onDisk int64
	files := 0
	for i, d := range ds {
		fi, err := os.Stat(c.path(d))
		if c.Has(d) != (err == nil) {
			t.Errorf("chunk %d: in index %v, on disk %v", i, c.Has(d), err == nil)
		}
		if err == nil {
			onDisk += fi.Size()
			files++
		}
	}
	if onDisk != st.Bytes || int64(files) != st.Chunks || c.lru.len != files {
		t.Errorf("disk holds %d chunks of %d bytes, index %d of %d, lru %d", files, onDisk, st.Chunks, st.Bytes, c.lru.len)
	}
	if tmp := dirEntries(t, filepath.Join(dir, "tmp")); len(tmp) != 0 {
		t.Errorf("temp files left: %q", tmp)
	}

	// All of it survives a restart and verifies.
	c.Close()
	c = open(t, dir, limit, nil)
	for i, d := range ds {
		if c.Has(d) {
			mustRead(t, c, d, datas[i])
		}
	}
	if st := c.Stats(); st.CorruptDetected != 0 {
		t.Errorf("%d corrupt chunks after restart", st.CorruptDetected)
	}
}

func TestClassify(t *testing.T) {
	for _, err := range []error{
		&fs.PathError{Op: "write", Path: "x", Err: unix.ENOSPC},
		&fs.PathError{Op: "write", Path: "x", Err: unix.EDQUOT},
	} {
		if !errors.Is(classify(err), errdefs.ErrExhausted) {
			t.Errorf("classify(%v) is not ErrExhausted", err)
		}
	}
	if errors.Is(classify(fs.ErrPermission), errdefs.ErrExhausted) {
		t.Error("classify(EPERM) is ErrExhausted")
	}
}

// BenchmarkPin pins and unpins a layer of 100,000 chunks, all stored, and reports the longest
// a concurrent lookup waited meanwhile.
func BenchmarkPin(b *testing.B) {
	c, err := Open(b.TempDir(), 1<<50, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ds := make([][32]byte, 100_000)
	for i := range ds {
		binary.LittleEndian.PutUint64(ds[i][:], rand.Uint64())
		c.insertLocked(ds[i], 1<<20, 0)
	}
	stop := make(chan struct{})
	waited := make(chan time.Duration)
	go func() {
		var longest time.Duration
		for {
			select {
			case <-stop:
				waited <- longest
				return
			default:
			}
			t := time.Now()
			c.Has(ds[0])
			longest = max(longest, time.Since(t))
		}
	}()
	b.ResetTimer()
	for b.Loop() {
		c.Pin("layer", ds)
		c.Unpin("layer")
	}
	b.StopTimer()
	close(stop)
	b.ReportMetric(float64((<-waited).Microseconds()), "max-lookup-wait-µs")
}

// BenchmarkReadAt reads 4 KiB from 64 cached chunks from parallel goroutines.
func BenchmarkReadAt(b *testing.B) {
	c, err := Open(b.TempDir(), 1<<30, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var ds [][32]byte
	for i := range 64 {
		d, data := chunk(i, 64<<10)
		if err := c.Put(d, data); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, d)
	}
	b.SetBytes(4096)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		p := make([]byte, 4096)
		i := 0
		for pb.Next() {
			if _, err := c.ReadAt(ds[i%len(ds)], p, 8192); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}
