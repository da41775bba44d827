//go:build linux

package chunkcache

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// MaxChunkSize is the largest chunk the cache stores, in bytes.
const MaxChunkSize = 1 << 20

const (
	// pinBatch is how many digests Pin and Unpin update per hold of mu, so that reads in
	// between wait well under a millisecond however large the layer.
	pinBatch = 1024
	// maxOpenFiles bounds the idle chunk files kept open for the next read.
	maxOpenFiles = 256
	// persistInterval is how often, at most, a chunk's access time is written to its mtime.
	persistInterval = time.Minute
)

// errClosed is what every call on a closed Cache returns.
var errClosed = fmt.Errorf("chunk cache is closed: %w", errdefs.ErrUnavailable)

// Stats are a Cache's figures: gauges of what it holds now and counters since Open.
type Stats struct {
	Bytes        int64 // bytes of the chunks stored
	Chunks       int64 // chunks stored
	PinnedBytes  int64 // bytes of the stored chunks that some owner pins
	PinnedChunks int64 // stored chunks that some owner pins
	Limit        int64 // maxBytes

	Evictions       int64 // chunks evicted to make room or to meet the limit
	EvictedBytes    int64 // their bytes
	CorruptDetected int64 // chunks deleted because ReadAt found them corrupt
	Puts            int64 // chunks written by Put (not counting Puts of chunks already stored)
	PutBytes        int64 // their bytes
	Bypassed        int64 // Puts refused with errdefs.ErrExhausted (all pinned, or disk full)
}

// Cache is an open chunk cache directory. See the package doc for its lifecycle.
type Cache struct {
	dir       string
	chunksDir string // dir/sha256
	tmpDir    string // dir/tmp
	log       *slog.Logger
	lock      *os.File // holds the flock on dir/lock

	// now is the clock and maxOpen the open file bound; tests replace them right after Open.
	now     func() time.Time
	maxOpen int

	shards [256]dirSync // fsync groups of dir/sha256/<ab>, by the digest's first byte

	// pinMu serializes Pin and Unpin; it is taken before mu, never while holding it.
	pinMu  sync.Mutex
	owners map[string][][32]byte // owner -> the digests it pins, sorted, without duplicates; protected by pinMu

	// ops counts Puts, ReadAts, Trims and Removes in progress; Close waits for them. Add is
	// only called with mu held and closed false.
	ops sync.WaitGroup

	mu sync.Mutex
	// Everything below is protected by mu.
	//
	// Invariants: bytes is the sum of the sizes in entries, pinnedBytes that of the pinned
	// ones; lru holds exactly the unpinned entries; a digest in busy is not in entries; the
	// pins on a digest are counted in its entry when it is stored, in pending when not.
	closed       bool
	limit        int64
	bytes        int64
	pinnedBytes  int64
	pinnedCount  int64 // entries that are pinned
	reserved     int64 // bytes of Puts that made room and are writing
	entries      map[[32]byte]*entry
	lru          *entryList // unpinned entries
	idle         *entryList // entries with an open file and no reader
	openFiles    int        // entries with a file open, idle or not
	busy         map[[32]byte]chan struct{}
	pending      map[[32]byte]int32 // digest not stored -> number of owners pinning it
	stats        Stats              // the counters; the gauges are computed by Stats
	bypassLogged int64              // when a refused Put was last logged, Unix nanoseconds
}

// entry is one stored chunk. Fields other than digest and size are protected by Cache.mu.
type entry struct {
	digest [32]byte
	size   int64

	atime   int64 // last access, Unix nanoseconds
	mtime   int64 // the file's mtime as last set or read, Unix nanoseconds
	pins    int32 // owners pinning it; while above 0 it is in no lru list
	removed bool  // no longer in the index; its file goes when the last reader is done

	verified  bool          // its bytes were hashed (or written) by this process
	verifying chan struct{} // non-nil while a reader hashes it; closed when done

	lru     links    // its place in Cache.lru
	file    *os.File // open for reading, or nil
	readers int      // ReadAts using file
	idle    links    // its place in Cache.idle
}

// dirSync groups the fsyncs of one chunk directory: a Put that renamed a file into it waits
// for an fsync that started after its rename, which one caller does for all that wait.
type dirSync struct {
	renames atomic.Uint64 // renames into the directory so far
	mu      sync.Mutex
	synced  uint64 // renames made durable by a finished fsync; protected by mu
}

// Open opens the cache in dir, creating it if needed, for at most maxBytes bytes of chunks.
// It fails with errdefs.ErrConflict when another Cache, in any process, has dir open. log may
// be nil.
func Open(dir string, maxBytes int64, log *slog.Logger) (*Cache, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if dir == "" {
		return nil, errdefs.Invalid("dir", "the chunk cache needs a directory")
	}
	if maxBytes < 0 {
		return nil, errdefs.Invalid("maxBytes", "must be 0 or more, not %d", maxBytes)
	}
	start := time.Now()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open chunk cache: %w", err)
	}
	// Chunks are image contents; host users have no business reading them.
	if fi, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("open chunk cache: %w", err)
	} else if fi.Mode().Perm() != 0o700 {
		log.Warn("chunk cache directory was not private; setting mode 0700", "dir", dir, "mode", fi.Mode().Perm())
		if err := os.Chmod(dir, 0o700); err != nil {
			return nil, fmt.Errorf("open chunk cache: %w", err)
		}
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open chunk cache: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, errdefs.Conflict("open chunk cache: %s is in use by another process (or another Cache in this one)", dir)
		}
		return nil, fmt.Errorf("open chunk cache: lock %s: %w", dir, err)
	}
	c := &Cache{
		dir:       dir,
		chunksDir: filepath.Join(dir, "sha256"),
		tmpDir:    filepath.Join(dir, "tmp"),
		log:       log,
		lock:      lock,
		now:       time.Now,
		maxOpen:   maxOpenFiles,
		limit:     maxBytes,
		entries:   map[[32]byte]*entry{},
		lru:       newEntryList(func(e *entry) *links { return &e.lru }),
		idle:      newEntryList(func(e *entry) *links { return &e.idle }),
		busy:      map[[32]byte]chan struct{}{},
		pending:   map[[32]byte]int32{},
		owners:    map[string][][32]byte{},
	}
	if err := c.load(); err != nil {
		lock.Close()
		return nil, fmt.Errorf("open chunk cache %s: %w", dir, err)
	}
	c.log.Info("chunk cache opened", "dir", dir, "chunks", len(c.entries), "bytes", c.bytes,
		"limit", maxBytes, "took", time.Since(start).Round(time.Millisecond))
	if c.bytes > maxBytes {
		c.log.Warn("chunk cache holds more than its limit; the next Put or Trim evicts",
			"dir", dir, "bytes", c.bytes, "limit", maxBytes)
	}
	return c, nil
}

// Close waits for the calls in progress, saves access times, closes the cached files and
// releases the directory. Calling it again does nothing.
func (c *Cache) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.ops.Wait()

	// Nothing that reads or writes files runs now; collect under mu for the other methods.
	type touch struct {
		d [32]byte
		t int64
	}
	var touches []touch
	var files []*os.File
	c.mu.Lock()
	for d, e := range c.entries {
		if e.atime > e.mtime {
			touches = append(touches, touch{d, e.atime})
			e.mtime = e.atime
		}
		if e.file != nil {
			files = append(files, e.file)
			e.file = nil
		}
	}
	c.idle.clear()
	c.openFiles = 0
	c.mu.Unlock()

	for _, f := range files {
		f.Close()
	}
	failed := 0
	for _, t := range touches {
		tm := time.Unix(0, t.t)
		if err := os.Chtimes(c.path(t.d), tm, tm); err != nil {
			failed++
		}
	}
	if failed > 0 {
		c.log.Warn("chunk cache: could not save some access times; eviction order after restart is approximate",
			"dir", c.dir, "failed", failed)
	}
	if err := c.lock.Close(); err != nil {
		return fmt.Errorf("close chunk cache %s: %w", c.dir, err)
	}
	return nil
}

// Has reports whether the chunk is stored. It does not count as an access.
func (c *Cache) Has(digest [32]byte) bool {
	_, ok := c.Size(digest)
	return ok
}

// Size returns the size of a stored chunk. It does not count as an access.
func (c *Cache) Size(digest [32]byte) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, false
	}
	e := c.entries[digest]
	if e == nil {
		return 0, false
	}
	return e.size, true
}

// Stats returns the cache's current figures.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Bytes = c.bytes
	s.Chunks = int64(len(c.entries))
	s.PinnedBytes = c.pinnedBytes
	s.PinnedChunks = c.pinnedCount
	s.Limit = c.limit
	return s
}

// Pin adds digests to the set that owner pins. Digests already in it, repeated ones and ones
// not stored yet are fine. Once Pin returns, no chunk in the set is evicted until Unpin.
func (c *Cache) Pin(owner string, digests [][32]byte) {
	add := slices.Clone(digests)
	slices.SortFunc(add, compareDigests)
	add = slices.Compact(add)

	c.pinMu.Lock()
	defer c.pinMu.Unlock()
	fresh, all := add, add
	if old := c.owners[owner]; len(old) > 0 {
		fresh, all = mergeDigests(old, add)
	}
	c.owners[owner] = all
	for batch := range slices.Chunk(fresh, pinBatch) {
		c.mu.Lock()
		for _, d := range batch {
			c.pinLocked(d)
		}
		c.mu.Unlock()
	}
}

// Unpin drops every pin owner holds. The chunks that no owner pins any more count as used
// now and become evictable.
func (c *Cache) Unpin(owner string) {
	c.pinMu.Lock()
	defer c.pinMu.Unlock()
	ds := c.owners[owner]
	delete(c.owners, owner)
	now := c.now().UnixNano()
	for batch := range slices.Chunk(ds, pinBatch) {
		c.mu.Lock()
		for _, d := range batch {
			c.unpinLocked(d, now)
		}
		c.mu.Unlock()
	}
}

// mergeDigests returns the digests of add that are not in old, and the union of both. Both
// inputs and outputs are sorted and free of duplicates.
func mergeDigests(old, add [][32]byte) (fresh, all [][32]byte) {
	all = make([][32]byte, 0, len(old)+len(add))
	i := 0
	for _, d := range add {
		for i < len(old) && compareDigests(old[i], d) < 0 {
			all = append(all, old[i])
			i++
		}
		if i < len(old) && old[i] == d {
			continue // pinned already; old[i] goes into all with the next digest or at the end
		}
		fresh = append(fresh, d)
		all = append(all, d)
	}
	return fresh, append(all, old[i:]...)
}

// pinLocked adds one owner's pin to d.
//
// Preconditions: c.mu is held.
func (c *Cache) pinLocked(d [32]byte) {
	e := c.entries[d]
	if e == nil {
		c.pending[d]++
		return
	}
	e.pins++
	if e.pins == 1 {
		c.lru.remove(e)
		c.pinnedBytes += e.size
		c.pinnedCount++
	}
}

// unpinLocked drops one owner's pin from d; when it was the last, d is used at now.
//
// Preconditions: c.mu is held; the owner pins d.
func (c *Cache) unpinLocked(d [32]byte, now int64) {
	e := c.entries[d]
	if e == nil {
		if n := c.pending[d] - 1; n > 0 {
			c.pending[d] = n
		} else {
			delete(c.pending, d)
		}
		return
	}
	e.pins--
	if e.pins == 0 {
		e.atime = max(e.atime, now)
		c.lru.pushFront(e)
		c.pinnedBytes -= e.size
		c.pinnedCount--
	}
}

// beginLocked registers a call that Close must wait for.
//
// Preconditions: c.mu is held.
func (c *Cache) beginLocked() error {
	if c.closed {
		return errClosed
	}
	c.ops.Add(1)
	return nil
}

// touchLocked records an access to e at now.
//
// Preconditions: c.mu is held.
func (c *Cache) touchLocked(e *entry, now int64) {
	e.atime = max(e.atime, now)
	if e.pins == 0 {
		c.lru.moveToFront(e)
	}
}

// insertLocked adds a chunk just written to the index.
//
// Preconditions: c.mu is held; d is neither in entries nor in busy.
func (c *Cache) insertLocked(d [32]byte, size, now int64) {
	e := &entry{digest: d, size: size, atime: now, mtime: now, verified: true}
	c.entries[d] = e
	c.bytes += size
	if n := c.pending[d]; n > 0 {
		delete(c.pending, d)
		e.pins = n
		c.pinnedBytes += size
		c.pinnedCount++
	} else {
		c.lru.pushFront(e)
	}
}

// removal is a chunk taken out of the index whose file is still to be deleted.
type removal struct {
	digest [32]byte
	file   *os.File // to close, or nil when readers still use it
	done   chan struct{}
}

// removeLocked takes e out of the index and marks its digest busy until finish deletes the
// file.
//
// Preconditions: c.mu is held; e is in entries.
func (c *Cache) removeLocked(e *entry) removal {
	delete(c.entries, e.digest)
	c.bytes -= e.size
	if e.pins > 0 {
		c.pending[e.digest] = e.pins
		e.pins = 0
		c.pinnedBytes -= e.size
		c.pinnedCount--
	} else {
		c.lru.remove(e)
	}
	e.removed = true
	r := removal{digest: e.digest, done: make(chan struct{})}
	if e.file != nil && e.readers == 0 {
		r.file = e.file
		c.dropFileLocked(e)
	}
	c.busy[e.digest] = r.done
	return r
}

// finish deletes the files of removed chunks and clears their busy marks. Call it without
// holding c.mu.
func (c *Cache) finish(rs []removal) {
	if len(rs) == 0 {
		return
	}
	for _, r := range rs {
		if r.file != nil {
			r.file.Close()
		}
		if err := os.Remove(c.path(r.digest)); err != nil && !errors.Is(err, os.ErrNotExist) {
			c.log.Error("chunk cache: could not delete a chunk file; it takes disk space until a restart finds it",
				"digest", hexDigest(r.digest), "err", err)
		}
	}
	c.mu.Lock()
	for _, r := range rs {
		delete(c.busy, r.digest)
		close(r.done)
	}
	c.mu.Unlock()
}

// dropFileLocked forgets e's open file, which the caller closes.
//
// Preconditions: c.mu is held; e.file is open and has no readers.
func (c *Cache) dropFileLocked(e *entry) {
	if c.idle.contains(e) {
		c.idle.remove(e)
	}
	e.file = nil
	c.openFiles--
}

// path returns the file name of a chunk.
func (c *Cache) path(d [32]byte) string {
	h := hexDigest(d)
	return filepath.Join(c.chunksDir, h[:2], h)
}

func hexDigest(d [32]byte) string { return hex.EncodeToString(d[:]) }

func compareDigests(a, b [32]byte) int { return bytes.Compare(a[:], b[:]) }

// notFound is the error for a chunk the cache does not have.
func notFound(d [32]byte) error {
	return errdefs.NotFound("chunk sha256:%s", hexDigest(d))
}
