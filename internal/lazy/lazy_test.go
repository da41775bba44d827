//go:build linux

package lazy

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/blobstore"
	"github.com/corral-dev/corral/internal/erofs"
	"github.com/corral-dev/corral/internal/errdefs"
)

// needRoot skips tests that mount FUSE and EROFS.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts FUSE and EROFS")
	}
	if _, err := erofs.Version(); err != nil {
		t.Skipf("needs mkfs.erofs: %v", err)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("needs /dev/fuse: %v", err)
	}
}

// faultyStore wraps a blob store: ranged reads can be delayed, refused or corrupted.
type faultyStore struct {
	blobstore.Store
	delay      atomic.Int64 // nanoseconds per ranged read
	fail       atomic.Bool
	corruptN   atomic.Int64 // corrupt the next N ranged reads
	rangeReads atomic.Int64
}

func (f *faultyStore) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	f.rangeReads.Add(1)
	if d := time.Duration(f.delay.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if f.fail.Load() {
		return nil, fmt.Errorf("injected: blob store unreachable: %w", errdefs.ErrUnavailable)
	}
	rc, err := f.Store.GetRange(ctx, key, off, length)
	if err != nil || f.corruptN.Add(-1) < 0 {
		f.corruptN.Store(0)
		return rc, err
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		return nil, err
	}
	if len(b) > 0 {
		b[len(b)/2] ^= 0xff
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

// fixture is one split layer in a directory blob store, served by a Server in this process.
type fixture struct {
	t      *testing.T
	dir    string // the server's directory
	src    string // the layer's tree
	meta   string // the metadata image
	name   string
	blobs  *faultyStore
	spec   string // the blob store's spec
	stop   context.CancelFunc
	done   chan error
	client *Client
}

const testChunk = 64 << 10

// newFixture builds a layer with a 3 MiB random file, a copy of it, 200 small files and a
// zero file, publishes its data blob and table, and starts a server.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := buildFixture(t)
	f.start(Config{ReadTimeout: 2 * time.Second, CatchUp: -1})
	t.Cleanup(f.close)
	return f
}

// buildFixture is newFixture without a server.
func buildFixture(t *testing.T) *fixture {
	t.Helper()
	needRoot(t)
	base := t.TempDir()
	f := &fixture{t: t, dir: filepath.Join(base, "lazy"), src: filepath.Join(base, "src")}
	big := make([]byte, 3<<20+123)
	rand.Read(big)
	for i := range 200 {
		small := make([]byte, 100+i*37)
		rand.Read(small)
		writeTestFile(t, filepath.Join(f.src, "small", fmt.Sprintf("f%03d", i)), small)
	}
	writeTestFile(t, filepath.Join(f.src, "big.bin"), big)
	writeTestFile(t, filepath.Join(f.src, "copy", "big.bin"), big)
	writeTestFile(t, filepath.Join(f.src, "zeros"), make([]byte, 300<<10))
	f.meta = filepath.Join(base, "meta.erofs")
	data := filepath.Join(base, "data.blob")
	ctx := context.Background()
	if err := erofs.BuildSplit(ctx, f.src, f.meta, data, testChunk); err != nil {
		t.Fatal(err)
	}
	chunks, err := erofs.Chunks(ctx, f.meta, data, testChunk)
	if err != nil {
		t.Fatal(err)
	}
	st, err := blobstore.Open(ctx, "dir:"+filepath.Join(base, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	f.blobs = &faultyStore{Store: st}
	fi, _ := os.Stat(data)
	tb := Table{DataKey: "data/test.blob", DataSize: fi.Size(), ChunkSize: testChunk}
	for _, c := range chunks {
		tb.Chunks = append(tb.Chunks, Chunk(c))
	}
	df, _ := os.Open(data)
	if err := st.Put(ctx, tb.DataKey, df, fi.Size()); err != nil {
		t.Fatal(err)
	}
	df.Close()
	f.name = strings.Repeat("ab", 32)
	b, err := json.Marshal(&tb)
	if err != nil {
		t.Fatal(err)
	}
	writeTestFile(t, filepath.Join(f.dir, tablesDir, f.name+".json"), b)
	f.spec = "dir:" + filepath.Join(base, "blobs")
	return f
}

func writeTestFile(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// start runs a server in this process and connects a client.
func (f *fixture) start(cfg Config) {
	f.t.Helper()
	cfg.Dir, cfg.Blobs = f.dir, f.blobs
	cfg.CacheMax = max(cfg.CacheMax, 64<<20)
	cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	ctx, stop := context.WithCancel(context.Background())
	f.stop, f.done = stop, make(chan error, 1)
	go func() { f.done <- Run(ctx, cfg) }()
	c, err := Start(context.Background(), StartOptions{Dir: f.dir, BlobStore: f.blobs.String()})
	if err != nil {
		f.t.Fatal(err)
	}
	f.client = c
}

// close lets go of the server and waits for it to exit (it must, once nothing is mounted).
func (f *fixture) close() {
	if f.client == nil {
		return
	}
	f.client.Close()
	f.stop()
	select {
	case err := <-f.done:
		if err != nil {
			f.t.Errorf("server: %v", err)
		}
	case <-time.After(15 * time.Second):
		f.t.Errorf("server did not exit once idle")
	}
	f.client = nil
	if mnt := filepath.Join(f.dir, mntDir); isFuseMount(mnt) {
		f.t.Errorf("FUSE mount left at %s", mnt)
		syscall.Unmount(mnt, syscall.MNT_DETACH)
	}
}

// mount mounts the layer with its blob served by the server; the returned func unmounts it.
func (f *fixture) mount() (string, func()) {
	f.t.Helper()
	target := f.t.TempDir()
	if _, err := erofs.Mount(f.meta, target, erofs.MountOptions{Devices: []string{f.client.BlobPath(f.name)}}); err != nil {
		f.t.Fatal(err)
	}
	var once sync.Once
	unmount := func() {
		once.Do(func() {
			if err := erofs.Unmount(target); err != nil {
				f.t.Error(err)
			}
		})
	}
	f.t.Cleanup(unmount) // also when a test fails before its own unmount: the server can then exit
	return target, unmount
}

func (f *fixture) stats() Stats {
	f.t.Helper()
	st, err := f.client.LayerStats(context.Background(), f.name)
	if err != nil {
		f.t.Fatal(err)
	}
	return st
}

// compare checks that every regular file under the mount equals the source.
func (f *fixture) compare(mnt string, only ...string) {
	f.t.Helper()
	err := filepath.WalkDir(f.src, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(f.src, p)
		if len(only) > 0 && !strings.HasPrefix(rel, only[0]) {
			return nil
		}
		want, _ := os.ReadFile(p)
		got, err := os.ReadFile(filepath.Join(mnt, rel))
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("%s: %d bytes differ from the source's %d", rel, len(got), len(want))
		}
		return nil
	})
	if err != nil {
		f.t.Fatal(err)
	}
}

func TestReadsFetchOnDemandAndCache(t *testing.T) {
	f := newFixture(t)
	mnt, unmount := f.mount()
	// Metadata is local: listing fetches nothing.
	if _, err := os.ReadDir(filepath.Join(mnt, "small")); err != nil {
		t.Fatal(err)
	}
	if st := f.stats(); st.BytesFetched != 0 {
		t.Fatalf("listing a directory fetched %d bytes", st.BytesFetched)
	}
	f.compare(mnt, "small/f00")
	part := f.stats()
	if part.BytesFetched == 0 || part.BytesFetched >= part.DataSize/2 {
		t.Fatalf("reading 10 small files fetched %d of %d bytes", part.BytesFetched, part.DataSize)
	}
	if part.Open != 1 {
		t.Fatalf("open handles = %d, want 1 (the mount)", part.Open)
	}
	f.compare(mnt)
	// Fetched bytes reach the reader before they are stored: the cache catches up just after.
	full := f.stats()
	for deadline := time.Now().Add(5 * time.Second); full.CachedBytes != full.DataSize && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		full = f.stats()
	}
	if full.CachedBytes != full.DataSize || full.CachedChunks != full.Chunks {
		t.Fatalf("after reading everything the cache holds %d of %d bytes", full.CachedBytes, full.DataSize)
	}
	// The copy of big.bin shares its chunks: nothing was fetched twice.
	if full.BytesFetched > full.DataSize {
		t.Fatalf("fetched %d bytes of a %d-byte blob", full.BytesFetched, full.DataSize)
	}
	unmount()
	// A fresh mount has a cold page cache: every read is a cache hit, nothing is fetched.
	mnt, unmount = f.mount()
	defer unmount()
	before := f.blobs.rangeReads.Load()
	f.compare(mnt)
	if n := f.blobs.rangeReads.Load() - before; n != 0 {
		t.Fatalf("a warm cache still read the blob store %d times", n)
	}
	if st := f.stats(); st.Hits <= full.Hits {
		t.Fatalf("no cache hits counted: %+v", st)
	}
}

// TestChunkStoredAfterAMissIsNotFetchedAgain: a reader that missed a chunk in the cache while
// another fetch of it was finishing asks for it once that fetch stored it and left flight. The
// chunk comes from the cache; the blob store is not read again (under load this was a second
// fetch of the same chunk).
func TestChunkStoredAfterAMissIsNotFetchedAgain(t *testing.T) {
	f := buildFixture(t)
	s, err := New(Config{Dir: f.dir, Blobs: f.blobs, ReadTimeout: 10 * time.Second, CatchUp: -1, CacheMax: 64 << 20,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l, err := s.layer(f.name)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The first reader's fetch, until its chunk is in the cache and out of flight.
	c, _ := s.startFetch(l, 0, 1, testChunk, nil, true)
	<-c.stored
	if c.err != nil {
		t.Fatal(c.err)
	}
	reads := f.blobs.rangeReads.Load()
	// The second reader missed before that: it now asks for the chunk.
	if c, _ := s.startFetch(l, 0, 1, testChunk, nil, true); c != nil {
		t.Fatalf("a cached chunk was fetched again")
	}
	data, err := s.chunk(ctx, l, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(data) != l.t.Chunks[0].Sum {
		t.Fatalf("chunk 0 from the cache has the wrong content")
	}
	if n := f.blobs.rangeReads.Load() - reads; n != 0 {
		t.Fatalf("the blob store was read %d more times for a cached chunk", n)
	}
}

func TestUnreachableStoreFailsReadsWithEIOThenRecovers(t *testing.T) {
	f := newFixture(t)
	mnt, unmount := f.mount()
	defer unmount()
	f.blobs.fail.Store(true)
	start := time.Now()
	_, err := os.ReadFile(filepath.Join(mnt, "big.bin"))
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "input/output error") {
		t.Fatalf("read with the store down: %v, want EIO", err)
	}
	if took > 10*time.Second {
		t.Fatalf("the failing read took %s; the timeout is 2 s", took)
	}
	st := f.stats()
	if st.ReadErrors == 0 || st.FetchErrors == 0 || !strings.Contains(st.LastError, "unreachable") {
		t.Fatalf("stats after the failure: read_errors %d fetch_errors %d last_error %q", st.ReadErrors, st.FetchErrors, st.LastError)
	}
	// Metadata stays readable, and the mount recovers once the store is back.
	if _, err := os.ReadDir(filepath.Join(mnt, "small")); err != nil {
		t.Fatal(err)
	}
	f.blobs.fail.Store(false)
	f.compare(mnt, "big.bin")
}

func TestSlowStoreRetriesWithinTheTimeout(t *testing.T) {
	f := newFixture(t)
	mnt, unmount := f.mount()
	defer unmount()
	f.blobs.delay.Store(int64(300 * time.Millisecond))
	f.compare(mnt, "small/f01")
	if st := f.stats(); st.FetchLatency.P50Ms < 200 {
		t.Fatalf("fetch latency p50 %gms with a 300 ms store", st.FetchLatency.P50Ms)
	}
}

func TestCorruptChunksAreRefetched(t *testing.T) {
	f := newFixture(t)
	mnt, unmount := f.mount()
	// Corrupt in transit: detected and fetched again.
	f.blobs.corruptN.Store(1)
	f.compare(mnt, "big.bin")
	if st := f.stats(); st.Corrupt == 0 {
		t.Fatalf("corrupt range not counted: %+v", st)
	}
	unmount()
	f.close()
	// Corrupt on the node's disk: detected on first use after a restart, and fetched again.
	var flipped int
	filepath.WalkDir(filepath.Join(f.dir, cacheDir, "sha256"), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			b, _ := os.ReadFile(p)
			b[0] ^= 1
			os.WriteFile(p, b, 0o600)
			flipped++
		}
		return nil
	})
	if flipped == 0 {
		t.Fatal("nothing in the chunk cache")
	}
	f.start(Config{ReadTimeout: 2 * time.Second, CatchUp: -1})
	mnt, unmount = f.mount()
	defer unmount()
	before := f.blobs.rangeReads.Load()
	f.compare(mnt, "big.bin")
	if f.blobs.rangeReads.Load() == before {
		t.Fatal("corrupt cached chunks were served instead of refetched")
	}
}

func TestPrefetchReplaysTheRecordedStartupSet(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	// First start: lazy, recording for 1 s. Reads from this process belong to no sandbox, so
	// they are recorded for every sandbox recording the layer.
	if err := f.client.Register(ctx, SandboxRequest{ID: "sb-1", Key: "env:py", Layers: []string{f.name}, Mode: ModeLazy, RecordSeconds: 1}); err != nil {
		t.Fatal(err)
	}
	mnt, unmount := f.mount()
	f.compare(mnt, "small/f1")
	unmount()
	first := f.stats()
	time.Sleep(1500 * time.Millisecond)
	if _, err := f.client.Unregister(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	prof, err := os.ReadFile(filepath.Join(f.dir, profilesDir, hashKey("env:py"), f.name+".json"))
	if err != nil {
		t.Fatalf("no profile recorded: %v", err)
	}
	// A cold node that never ran the environment: no cache, no local profile; the profile the
	// first node shared in the blob store is what it prefetches.
	f.close()
	os.RemoveAll(filepath.Join(f.dir, cacheDir))
	os.RemoveAll(filepath.Join(f.dir, profilesDir))
	f.start(Config{ReadTimeout: 2 * time.Second, CatchUp: -1})
	if err := f.client.Register(ctx, SandboxRequest{ID: "sb-2", Key: "env:py", Layers: []string{f.name}, Mode: ModePrefetch}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for f.stats().CachedBytes < first.BytesFetched && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	st := f.stats()
	if st.Prefetch.Chunks == 0 || st.CachedBytes < first.BytesFetched {
		t.Fatalf("prefetch of profile %s fetched %d chunks, %d bytes cached; the first start fetched %d bytes", prof, st.Prefetch.Chunks, st.CachedBytes, first.BytesFetched)
	}
	before := f.blobs.rangeReads.Load()
	mnt, unmount = f.mount()
	defer unmount()
	f.compare(mnt, "small/f1")
	if n := f.blobs.rangeReads.Load() - before; n != 0 {
		t.Fatalf("the start-up reads still went to the blob store %d times after prefetch", n)
	}
	if st := f.stats(); st.Prefetch.Used == 0 || st.Prefetch.Effectiveness <= 0 {
		t.Fatalf("prefetched chunks read but not counted: %+v", st.Prefetch)
	}
	sst, err := f.client.Unregister(ctx, "sb-2")
	if err != nil || sst.Sandbox != "sb-2" {
		t.Fatalf("unregister: %+v %v", sst, err)
	}
}

func TestEagerFetchesEverythingFirst(t *testing.T) {
	f := newFixture(t)
	if err := f.client.Register(context.Background(), SandboxRequest{ID: "sb-e", Key: "k", Layers: []string{f.name}, Mode: ModeEager}); err != nil {
		t.Fatal(err)
	}
	st := f.stats()
	if st.CachedBytes != st.DataSize {
		t.Fatalf("eager returned with %d of %d bytes cached", st.CachedBytes, st.DataSize)
	}
	f.blobs.fail.Store(true) // nothing more may be fetched
	mnt, unmount := f.mount()
	defer unmount()
	f.compare(mnt)
}

func TestEagerFailsWhenTheStoreIsDown(t *testing.T) {
	f := newFixture(t)
	f.blobs.fail.Store(true)
	err := f.client.Register(context.Background(), SandboxRequest{ID: "sb-x", Layers: []string{f.name}, Mode: ModeEager})
	if err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("eager with the store down: %v", err)
	}
}

func TestBackgroundFillIsRateCapped(t *testing.T) {
	f := newFixture(t)
	const rate = 4 << 20 // bytes per second
	start := time.Now()
	if err := f.client.Register(context.Background(), SandboxRequest{ID: "sb-f", Key: "k", Layers: []string{f.name},
		Mode: ModePrefetch, FillRate: map[string]int64{f.name: rate}}); err != nil {
		t.Fatal(err)
	}
	var st Stats
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if st = f.stats(); st.CachedBytes == st.DataSize {
			break
		}
	}
	took := time.Since(start)
	if st.CachedBytes != st.DataSize {
		t.Fatalf("fill stopped at %d of %d bytes", st.CachedBytes, st.DataSize)
	}
	// About 3.7 MiB at 4 MiB/s: well over half a second (the rate is a cap, not a target).
	if min := time.Duration(float64(st.DataSize-testChunk*32) / rate * float64(time.Second)); took < min {
		t.Fatalf("filled %d bytes in %s, faster than the %d B/s cap allows", st.DataSize, took, rate)
	}
}

func TestRequestsAreValidated(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for _, req := range []SandboxRequest{
		{ID: "", Mode: ModeLazy},
		{ID: "a/b", Mode: ModeLazy},
		{ID: "x", Mode: "sometimes"},
		{ID: "x", Mode: ModeLazy, RecordSeconds: 601},
		{ID: "x", Mode: ModeLazy, Layers: []string{"../../etc"}},
	} {
		if err := f.client.Register(ctx, req); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Register(%+v) = %v, want invalid", req, err)
		}
	}
	if err := f.client.Register(ctx, SandboxRequest{ID: "x", Mode: ModeLazy, Layers: []string{strings.Repeat("cd", 32)}}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a layer without a table: %v, want not found", err)
	}
	if _, err := f.client.Unregister(ctx, "never"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unregister unknown: %v", err)
	}
	// A second server for the same directory is refused.
	err := Run(ctx, Config{Dir: f.dir, Blobs: f.blobs})
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second Run: %v, want conflict", err)
	}
}

func TestTableCheck(t *testing.T) {
	sum := [32]byte{1}
	good := Table{DataKey: "d", DataSize: 10, Chunks: []Chunk{{0, 4, sum}, {4, 6, sum}}}
	if err := good.Check(); err != nil {
		t.Fatal(err)
	}
	for name, tb := range map[string]Table{
		"gap":     {DataKey: "d", DataSize: 10, Chunks: []Chunk{{0, 4, sum}, {5, 5, sum}}},
		"short":   {DataKey: "d", DataSize: 11, Chunks: []Chunk{{0, 4, sum}, {4, 6, sum}}},
		"empty":   {DataKey: "d", DataSize: 4, Chunks: []Chunk{{0, 4, sum}, {4, 0, sum}}},
		"no key":  {DataSize: 0},
		"too big": {DataKey: "d", DataSize: maxChunkLen + 1, Chunks: []Chunk{{0, maxChunkLen + 1, sum}}},
	} {
		if err := tb.Check(); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	b, _ := json.Marshal(&good)
	var back Table
	if err := json.Unmarshal(b, &back); err != nil || back.Chunks[1] != good.Chunks[1] {
		t.Fatalf("round trip: %v %+v", err, back)
	}
	for i, off := range []int64{0, 3, 4, 9} {
		if got, want := good.find(off), []int{0, 0, 1, 1}[i]; got != want {
			t.Errorf("find(%d) = %d, want %d", off, got, want)
		}
	}
}

func TestCatchUpFetchesTheRestOfAMuchReadLayer(t *testing.T) {
	f := newFixture(t)
	f.close()
	f.start(Config{ReadTimeout: 2 * time.Second, CatchUp: 0.5})
	mnt, unmount := f.mount()
	defer unmount()
	f.compare(mnt, "big.bin") // 3 MiB of a 4.2 MiB layer: past half of it fetched on demand
	var st Stats
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if st = f.stats(); st.CachedBytes == st.DataSize {
			break
		}
	}
	if st.CachedBytes != st.DataSize {
		t.Fatalf("after reading most of the layer, %d of %d bytes are cached; want the catch-up to fetch the rest", st.CachedBytes, st.DataSize)
	}
	f.blobs.fail.Store(true) // everything is local now
	f.compare(mnt)
}
