//go:build linux

package lazy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/internal/blobstore"
	"github.com/corral-dev/corral/internal/chunkcache"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lazyregexp"
)

// Config configures a Server. Zero fields take the defaults documented on each.
type Config struct {
	// Dir holds the server's state: see the package doc for its layout. Required.
	Dir string
	// Blobs is the blob store the data blobs are read from. Required.
	Blobs blobstore.Store
	// CacheMax bounds the chunk cache on disk (default 10 GiB).
	CacheMax int64
	// ReadTimeout bounds how long a read waits for data the blob store has not delivered; the
	// reader then gets EIO (default 30 s). Fetches are retried with backoff until then.
	ReadTimeout time.Duration
	// FetchWindow is the most one ranged read of the blob store asks for on a miss: the chunk
	// read plus the missing chunks after it (default 2 MiB).
	FetchWindow int64
	// Parallel is how many ranged reads prefetch and eager fetches run at once (default 16); a
	// server runs at most 4x this many at once in all.
	Parallel int
	// Readahead is how far ahead of a sequential reader chunks are fetched (default 16 MiB;
	// negative: none).
	Readahead int64
	// CatchUp: once reads waiting on the blob store have fetched this share of a layer (default
	// 0.25; negative: never), the rest of it is fetched at once, as eager would, instead of one
	// miss at a time (a task that reads much of a layer in no order).
	CatchUp float64
	// KeeperCommand starts a keeper (the corral binary's hidden `lazyd-keeper` with --dir),
	// which holds the FUSE connection so that it outlives this server and restarts a server
	// that dies (RestartCommand). Nil: none; a server that dies leaves its mount dead.
	KeeperCommand []string
	// RestartCommand is this server's own command line, which the keeper runs again.
	RestartCommand []string
	// Log receives the server's log; nil discards.
	Log *slog.Logger
}

func (c *Config) defaults() error {
	if c.Dir == "" || c.Blobs == nil {
		return errdefs.Invalid("config", "a state directory and a blob store are required")
	}
	if c.CacheMax == 0 {
		c.CacheMax = 10 << 30
	}
	if c.CacheMax < 64<<20 {
		return errdefs.Invalid("cache_max", "%d bytes is below the 64 MiB minimum", c.CacheMax)
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = 30 * time.Second
	}
	if c.FetchWindow == 0 {
		c.FetchWindow = 2 << 20
	}
	if c.Parallel == 0 {
		c.Parallel = 16
	}
	if c.Readahead == 0 {
		c.Readahead = 16 << 20
	}
	if c.CatchUp == 0 {
		c.CatchUp = 0.25
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Layout under Config.Dir.
const (
	mntDir      = "mnt"        // the FUSE mount: one <name>.blob per layer
	tablesDir   = "tables"     // <name>.json chunk tables, written by the layer store
	cacheDir    = "cache"      // the chunk cache
	profilesDir = "profiles"   // <key hash>/<name>.json prefetch profiles
	SocketName  = "lazyd.sock" // the control socket
)

// Modes of fetching a sandbox's layers.
const (
	ModeEager    = "eager"    // every chunk is fetched before the sandbox starts
	ModeLazy     = "lazy"     // chunks are fetched when read
	ModePrefetch = "prefetch" // the recorded start-up set is fetched at once, the rest when read
)

// ValidMode reports whether m names a fetch mode.
func ValidMode(m string) bool { return m == ModeEager || m == ModeLazy || m == ModePrefetch }

var nameRE = lazyregexp.New(`^[0-9a-f]{64}$`)

// Server serves layers' data blobs as files of a FUSE mount, fetching their chunks from the blob
// store into the node's chunk cache on demand.
type Server struct {
	cfg    Config
	cache  *chunkcache.Cache
	fetch  chan struct{} // semaphore for background ranged reads (prefetch, fill, eager, readahead)
	demand chan struct{} // semaphore for ranged reads a sandbox waits on

	ctx    context.Context // ends at Close: background prefetch and fill stop
	cancel context.CancelFunc

	mu        sync.Mutex
	layers    map[string]*layer   // name -> loaded layer
	inflight  map[[32]byte]*call  // chunk sum -> fetch in flight
	sandboxes map[string]*sandbox // registered sandboxes, by ID
	byID      map[uint64]*layer   // node ID -> loaded layer
	holds     int                 // control connections holding the server
	// exitWhenIdle is set by a client's Close (cleared by the next hold); everHeld once any
	// client held the server; closing once Run decided to exit (holds are then refused).
	exitWhenIdle, everHeld atomic.Bool
	closing                bool // guarded by mu
	saveMu                 sync.Mutex
	resumeOnly             bool          // started by a keeper: serve only the connection it holds
	idle                   chan struct{} // poked when opens or holds drop
}

// call is one chunk being fetched; readers take data once done is closed, and stored is closed
// once the chunk is in the cache too (or failed to be).
type call struct {
	done, stored chan struct{}
	data         []byte
	err          error
}

// layer is one data blob the server knows.
type layer struct {
	name string
	t    *Table
	ino  uint64 // FUSE node ID and inode number: nodeID(name)

	pinMu sync.Mutex // orders open/release with their Pin/Unpin

	// guarded by Server.mu
	opens      int
	prefetched map[int]bool // chunks fetched by prefetch and not read since
	filling    bool
	// Sequential readahead: nextSeq is the chunk a sequential reader misses next; chunks
	// [raFrom, raUntil) were read ahead, and a read at raTrigger or later reads further.
	nextSeq, raFrom, raUntil, raTrigger int
	streak                              int  // sequential misses in a row
	catchUp                             bool // the catch-up fill started

	st counters
}

// counters are the statistics kept per layer and per sandbox.
type counters struct {
	bytesRead, hits, misses             atomic.Int64
	bytesFetched, fetches, fetchErrors  atomic.Int64
	corrupt, readErrors                 atomic.Int64
	prefetchChunks, prefetchBytes, used atomic.Int64
	fillBytes                           atomic.Int64
	demandBytes                         atomic.Int64 // fetched for reads waiting on them
	lat                                 histogram
	lastErr                             atomic.Pointer[timedErr] // of any failure
	lastFetchErr                        atomic.Pointer[timedErr] // of a ranged read
}

type timedErr struct {
	At  time.Time
	Err string
}

func (c *counters) fail(err error) {
	c.lastErr.Store(&timedErr{At: time.Now().UTC(), Err: err.Error()})
}

// sandbox is a registered sandbox: reads by its processes are counted for it, and in its first
// seconds recorded into its environment's prefetch profile.
type sandbox struct {
	id, key string
	layers  []string
	st      counters
	timer   *time.Timer // ends the recording window
	// guarded by Server.mu
	recordUntil time.Time
	record      map[string]*recording // layer name -> chunks read, when that layer is recorded
}

type recording struct {
	seen  map[int]bool
	order []int
}

// New opens the chunk cache and prepares a server; Mount then serves it.
func New(cfg Config) (*Server, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	// The mount point is left to mount: a kept connection's mount must not be touched before
	// this server serves it.
	for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, tablesDir), filepath.Join(cfg.Dir, profilesDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	cache, err := chunkcache.Open(filepath.Join(cfg.Dir, cacheDir), cfg.CacheMax, cfg.Log)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{cfg: cfg, cache: cache, fetch: make(chan struct{}, 2*cfg.Parallel), demand: make(chan struct{}, 2*cfg.Parallel), ctx: ctx, cancel: cancel,
		layers: map[string]*layer{}, inflight: map[[32]byte]*call{}, sandboxes: map[string]*sandbox{},
		byID: map[uint64]*layer{}, idle: make(chan struct{}, 1)}, nil
}

// Close stops background work and closes the cache. The FUSE mount must be gone first.
func (s *Server) Close() error {
	s.cancel()
	return s.cache.Close()
}

// layer returns the loaded layer called name, reading its table on first use. A missing table
// wraps errdefs.ErrNotFound.
func (s *Server) layer(name string) (*layer, error) {
	if !nameRE.MatchString(name) {
		return nil, errdefs.Invalid("layer", "%q is not a 64-hex-digit name", name)
	}
	s.mu.Lock()
	l := s.layers[name]
	s.mu.Unlock()
	if l != nil {
		return l, nil
	}
	t, err := ReadTable(filepath.Join(s.cfg.Dir, tablesDir, name+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("layer %s has no chunk table on this node: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if err := blobstore.CheckKey(t.DataKey); err != nil {
		return nil, fmt.Errorf("layer %s: %w", name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.layers[name]; l != nil {
		return l, nil
	}
	l = &layer{name: name, t: t, ino: nodeID(name), prefetched: map[int]bool{}, nextSeq: -1}
	if other := s.byID[l.ino]; other != nil {
		return nil, fmt.Errorf("layers %s and %s share the node ID %016x: one of them cannot be served", other.name, name, l.ino)
	}
	s.layers[name] = l
	s.byID[l.ino] = l
	return l, nil
}

// open and release count the kernel's open handles of a layer's blob file: an EROFS mount holds
// one for its life. A layer with open handles has its chunks pinned in the cache.
func (s *Server) open(l *layer) {
	l.pinMu.Lock() // count change and pin in one order with release's
	defer l.pinMu.Unlock()
	s.mu.Lock()
	l.opens++
	first := l.opens == 1
	s.mu.Unlock()
	if first {
		s.cache.Pin(l.name, l.sums())
	}
}

func (s *Server) release(l *layer) {
	l.pinMu.Lock()
	defer l.pinMu.Unlock()
	s.mu.Lock()
	l.opens--
	last := l.opens == 0
	s.mu.Unlock()
	if last {
		s.cache.Unpin(l.name)
		s.pokeIdle()
	}
}

// sums lists the digests of l's chunks.
func (l *layer) sums() [][32]byte {
	sums := make([][32]byte, len(l.t.Chunks))
	for i, c := range l.t.Chunks {
		sums[i] = c.Sum
	}
	return sums
}

func (s *Server) pokeIdle() {
	select {
	case s.idle <- struct{}{}:
	default:
	}
}

// openFiles counts the open handles of all blob files.
func (s *Server) openFiles() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.openFilesLocked()
}

func (s *Server) openFilesLocked() int {
	n := 0
	for _, l := range s.layers {
		n += l.opens
	}
	return n
}

// inUse reports whether l is mounted or a registered sandbox uses it.
func (s *Server) inUse(l *layer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.opens > 0 {
		return true
	}
	for _, sb := range s.sandboxes {
		if slices.Contains(sb.layers, l.name) {
			return true
		}
	}
	return false
}

// busy reports whether any blob file is open or any client holds the server.
func (s *Server) busy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holds > 0 || s.openFilesLocked() > 0
}

// errTimeout is what a read that ran out of time reports.
var errTimeout = errors.New("the blob store did not deliver in time")

// read fills dest from the layer's data at off, from the cache or, for missing chunks, from the
// blob store. pid is the reading process (0 when the kernel reads on its own).
func (s *Server) read(ctx context.Context, l *layer, dest []byte, off int64, pid uint32) (int, error) {
	size := l.t.DataSize
	if off >= size || len(dest) == 0 {
		return 0, nil
	}
	end := min(off+int64(len(dest)), size)
	sb := s.attribute(pid)
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ReadTimeout)
	defer cancel()
	pos := off
	for i := l.t.find(off); pos < end; i++ {
		c := l.t.Chunks[i]
		lo, hi := pos-c.Off, min(end, c.Off+c.Len)-c.Off
		buf := dest[pos-off : pos-off+hi-lo]
		_, err := s.cache.ReadAt(c.Sum, buf, lo)
		switch {
		case err == nil:
			l.st.hits.Add(1)
			if sb != nil {
				sb.st.hits.Add(1)
			}
		case errors.Is(err, errdefs.ErrNotFound):
			l.st.misses.Add(1)
			if sb != nil {
				sb.st.misses.Add(1)
			}
			data, err := s.chunk(ctx, l, i, sb)
			if err != nil {
				l.st.readErrors.Add(1)
				l.st.fail(err)
				if sb != nil {
					sb.st.readErrors.Add(1)
					sb.st.fail(err)
				}
				s.cfg.Log.Error("read of a lazily fetched layer failed; the reader gets EIO", "layer", l.name,
					"offset", pos, "sandbox", sbID(sb), "pid", pid, "err", err)
				return 0, err
			}
			copy(buf, data[lo:hi])
		default:
			l.st.readErrors.Add(1)
			l.st.fail(err)
			s.cfg.Log.Error("read from the chunk cache failed; the reader gets EIO", "layer", l.name, "offset", pos, "err", err)
			return 0, err
		}
		s.noteRead(l, i, sb)
		pos += hi - lo
	}
	n := end - off
	l.st.bytesRead.Add(n)
	if sb != nil {
		sb.st.bytesRead.Add(n)
	}
	return int(n), nil
}

func sbID(sb *sandbox) string {
	if sb == nil {
		return ""
	}
	return sb.id
}

// noteRead records that chunk i of l was read: for prefetch effectiveness and for the profiles
// of sandboxes in their recording window.
func (s *Server) noteRead(l *layer, i int, sb *sandbox) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.raUntil > 0 && i >= l.raTrigger && i < l.raUntil {
		// A sequential reader is halfway through what was read ahead: read further.
		from := l.raUntil
		l.raTrigger = l.raUntil // once
		go s.readahead(l, from, s.cfg.Readahead, sb)
	}
	if l.prefetched[i] {
		delete(l.prefetched, i)
		l.st.used.Add(1)
		if sb != nil {
			sb.st.used.Add(1)
		}
	}
	now := time.Now()
	record := func(b *sandbox) {
		if r := b.record[l.name]; r != nil && now.Before(b.recordUntil) && !r.seen[i] {
			r.seen[i] = true
			r.order = append(r.order, i)
		}
	}
	if sb != nil {
		record(sb)
		return
	}
	// The kernel read on its own (readahead): count it for every sandbox recording this layer.
	for _, b := range s.sandboxes {
		record(b)
	}
}

// attribute finds the registered sandbox whose cgroup holds pid.
func (s *Server) attribute(pid uint32) *sandbox {
	if pid == 0 {
		return nil
	}
	s.mu.Lock()
	n := len(s.sandboxes)
	s.mu.Unlock()
	if n == 0 {
		return nil
	}
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/cgroup")
	if err != nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, line := range strings.Split(string(b), "\n") {
		_, p, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		if _, p, ok = strings.Cut(p, ":"); !ok {
			continue
		}
		for _, part := range strings.Split(p, "/") {
			if sb := s.sandboxes[part]; sb != nil {
				return sb
			}
		}
	}
	return nil
}

// chunk returns chunk i of l, fetching it (with the missing chunks after it, up to FetchWindow)
// when no fetch of it is in flight. The fetch runs on its own deadline, so a reader that gives up
// does not cancel it for the others waiting.
func (s *Server) chunk(ctx context.Context, l *layer, i int, sb *sandbox) ([]byte, error) {
	for cached := 0; ; {
		c, end := s.startFetch(l, i, i+1, s.cfg.FetchWindow, sb, true)
		if c == nil {
			// Stored since this reader missed it. Read from the cache; if it went again
			// (evicted), the next turn fetches it.
			data := make([]byte, l.t.Chunks[i].Len)
			_, err := s.cache.ReadAt(l.t.Chunks[i].Sum, data, 0)
			if err == nil {
				return data, nil
			}
			if cached++; cached > 3 || !errors.Is(err, errdefs.ErrNotFound) {
				return nil, fmt.Errorf("chunk %d of layer %s: read from the cache: %w", i, l.name, err)
			}
			continue
		}
		if s.cfg.Readahead > 0 {
			// A miss where the last one's range ended, or inside what was read ahead, is a
			// sequential reader: keep up to Readahead bytes in flight ahead of it.
			s.mu.Lock()
			seq := i == l.nextSeq || (l.raUntil > 0 && i >= l.raFrom && i < l.raUntil)
			streak := l.streak
			// A miss behind where the last one's range ended (the rest of that range, still
			// being stored, or a call in flight) says nothing new about the reader.
			if i >= l.nextSeq || !seq {
				if seq {
					l.streak++
				} else {
					l.streak = 0
				}
				streak = l.streak
				l.nextSeq = max(end, i+1)
			}
			s.mu.Unlock()
			// Two sequential misses in a row start it, small at first (a file of a few MiB
			// read whole is not a stream), doubling up to Readahead.
			if seq && streak >= 2 {
				s.readahead(l, end, min(s.cfg.Readahead, s.cfg.FetchWindow<<min(streak, 10)), sb)
			}
		}
		if s.cfg.CatchUp > 0 {
			s.mu.Lock()
			catchUp := !l.catchUp && float64(l.st.demandBytes.Load()) >= s.cfg.CatchUp*float64(l.t.DataSize)
			if catchUp {
				l.catchUp = true
			}
			s.mu.Unlock()
			if catchUp {
				go s.catchUpFill(l)
			}
		}
		select {
		case <-c.done:
			if c.err == nil {
				return c.data, nil
			}
			// The fetch this read joined may have started long before it and given up on its
			// own deadline: fetch again while this read has time left.
			select {
			case <-time.After(100 * time.Millisecond):
				continue
			case <-ctx.Done():
				return nil, c.err
			}
		case <-ctx.Done():
			why := ""
			if e := l.st.lastFetchErr.Load(); e != nil && time.Since(e.At) < 2*s.cfg.ReadTimeout {
				why = " (last fetch error: " + e.Err + ")"
			}
			return nil, fmt.Errorf("chunk %d (%d bytes at %d) of layer %s: %w after %s%s", i, l.t.Chunks[i].Len, l.t.Chunks[i].Off, l.name, errTimeout, s.cfg.ReadTimeout, why)
		}
	}
}

// readahead starts fetching the chunks from index from on that are neither cached nor in flight,
// up to size bytes, in ranges of up to FetchWindow, and remembers the region so that
// a reader halfway through it extends it.
func (s *Server) readahead(l *layer, from int, size int64, sb *sandbox) {
	n := len(l.t.Chunks)
	if from >= n {
		return
	}
	limit := l.t.Chunks[from].Off + size
	i := from
	for i < n && l.t.Chunks[i].Off < limit {
		s.mu.Lock()
		busy := s.inflight[l.t.Chunks[i].Sum] != nil
		s.mu.Unlock()
		if busy || s.cache.Has(l.t.Chunks[i].Sum) {
			i++
			continue
		}
		_, end := s.startFetch(l, i, i+1, s.cfg.FetchWindow, sb, false) // nil: stored meanwhile
		i = end
	}
	s.mu.Lock()
	// A reader ahead of the region, or one outside it (another stream), takes it over.
	if i > l.raUntil || from < l.raFrom || from >= l.raUntil {
		l.raFrom, l.raUntil, l.raTrigger = from, i, from+(i-from)/2
	}
	s.mu.Unlock()
}

// startFetch starts fetching chunks [i, j) of l, extended past j with following chunks that are
// neither cached nor in flight while the range stays within window, and returns the call of chunk
// i (which may be one already in flight) and the index after the last chunk it started. The call
// is nil when chunk i is in the cache: a fetch stored it after the caller looked. (A fetch puts
// its chunks in the cache before it takes them out of flight, both seen here under s.mu, so a
// chunk is never fetched twice.)
func (s *Server) startFetch(l *layer, i, j int, window int64, sb *sandbox, demand bool) (*call, int) {
	s.mu.Lock()
	if c := s.inflight[l.t.Chunks[i].Sum]; c != nil {
		s.mu.Unlock()
		return c, i + 1
	}
	if s.cache.Has(l.t.Chunks[i].Sum) {
		s.mu.Unlock()
		return nil, i + 1
	}
	var calls []*call
	var sums [][32]byte
	first := l.t.Chunks[i].Off
	k := i
	for ; k < len(l.t.Chunks); k++ {
		ch := l.t.Chunks[k]
		if k > i {
			if s.inflight[ch.Sum] != nil || containsSum(sums, ch.Sum) || s.cache.Has(ch.Sum) {
				break // in flight or cached already, or the same content twice in one range
			}
			if k >= j && ch.Off+ch.Len-first > window {
				break
			}
		}
		c := &call{done: make(chan struct{}), stored: make(chan struct{})}
		s.inflight[ch.Sum] = c
		calls = append(calls, c)
		sums = append(sums, ch.Sum)
	}
	s.mu.Unlock()
	go s.fetchRange(l, i, k, calls, sb, demand)
	return calls[0], k
}

func containsSum(sums [][32]byte, sum [32]byte) bool {
	for _, s := range sums {
		if s == sum {
			return true
		}
	}
	return false
}

// fetchRange reads chunks [i, k) of l with one ranged read, retried with backoff until the read
// deadline, checks each chunk's SHA-256, stores them in the cache and completes their calls.
func (s *Server) fetchRange(l *layer, i, k int, calls []*call, sb *sandbox, demand bool) {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.ReadTimeout)
	defer cancel()
	off := l.t.Chunks[i].Off
	length := l.t.Chunks[k-1].Off + l.t.Chunks[k-1].Len - off
	data, err := s.fetchVerified(ctx, l, i, k, off, length, sb, demand)
	// Waiters get the bytes first; the chunks stay in flight (so nobody fetches them again)
	// until they are in the cache.
	for n, c := range calls {
		if err != nil {
			c.err = err
		} else {
			ch := l.t.Chunks[i+n]
			c.data = data[ch.Off-off : ch.Off-off+ch.Len]
		}
		close(c.done)
	}
	for n, c := range calls {
		ch := l.t.Chunks[i+n]
		if err == nil {
			// fetchVerified checked the digest; the cache need not hash it again.
			if perr := s.cache.PutVerified(ch.Sum, c.data); perr != nil && !errors.Is(perr, errdefs.ErrExhausted) {
				s.cfg.Log.Warn("store a fetched chunk in the cache", "layer", l.name, "chunk", i+n, "err", perr)
			}
		}
		s.mu.Lock()
		delete(s.inflight, ch.Sum)
		s.mu.Unlock()
	}
	for _, c := range calls { // the whole range is stored once any of its calls says so
		close(c.stored)
	}
}

// fetchVerified reads [off, off+length) of l's blob and checks chunks [i, k) in it. Failures and
// corrupt chunks are retried with backoff (100 ms doubling to 3 s) until ctx ends.
func (s *Server) fetchVerified(ctx context.Context, l *layer, i, k int, off, length int64, sb *sandbox, demand bool) ([]byte, error) {
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		data, err := s.getRange(ctx, l, off, length, sb, demand)
		if err == nil {
			for n := i; n < k; n++ {
				ch := l.t.Chunks[n]
				if sha256.Sum256(data[ch.Off-off:ch.Off-off+ch.Len]) != ch.Sum {
					l.st.corrupt.Add(1)
					err = fmt.Errorf("chunk %d of layer %s (%d bytes at %d of %s) does not match its SHA-256: corrupt in the blob store or in transit", n, l.name, ch.Len, ch.Off, l.t.DataKey)
					break
				}
			}
			if err == nil {
				return data, nil
			}
		}
		l.st.fetchErrors.Add(1)
		l.st.fail(err)
		l.st.lastFetchErr.Store(&timedErr{At: time.Now(), Err: err.Error()})
		if sb != nil {
			sb.st.fetchErrors.Add(1)
		}
		s.cfg.Log.Warn("fetch from the blob store failed; retrying", "layer", l.name, "offset", off, "length", length,
			"attempt", attempt, "sandbox", sbID(sb), "err", err)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("fetch %d bytes at %d of %s from %s: %w (gave up after %d attempts)", length, off, l.t.DataKey, s.cfg.Blobs, err, attempt)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 3*time.Second)
	}
}

// getRange is one ranged read of the blob store, counted.
func (s *Server) getRange(ctx context.Context, l *layer, off, length int64, sb *sandbox, demand bool) ([]byte, error) {
	// Reads a sandbox waits on have slots of their own: prefetch, fill and readahead never
	// queue them.
	sem := s.fetch
	if demand {
		sem = s.demand
	}
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-sem }()
	start := time.Now()
	rc, err := s.cfg.Blobs.GetRange(ctx, l.t.DataKey, off, length)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data := make([]byte, length)
	if _, err := io.ReadFull(rc, data); err != nil {
		return nil, fmt.Errorf("read %d bytes at %d of %s: %w", length, off, l.t.DataKey, err)
	}
	d := time.Since(start)
	if demand { // counted once delivered: retries during an outage are no reads
		l.st.demandBytes.Add(length)
	}
	l.st.bytesFetched.Add(length)
	l.st.fetches.Add(1)
	l.st.lat.observe(d)
	if sb != nil {
		sb.st.bytesFetched.Add(length)
		sb.st.fetches.Add(1)
		sb.st.lat.observe(d)
	}
	return data, nil
}

// fetchChunks makes chunks idx of l present in the cache, in ranges of up to window bytes of
// consecutive missing chunks, Parallel ranges at once. It returns the first error.
func (s *Server) fetchChunks(ctx context.Context, l *layer, idx []int, window int64, prefetch bool, sb *sandbox) error {
	sem := make(chan struct{}, s.cfg.Parallel)
	var wg sync.WaitGroup
	var errOnce sync.Once
	var first error
	missing := make([]int, 0, len(idx))
	for _, i := range idx {
		if !s.cache.Has(l.t.Chunks[i].Sum) {
			missing = append(missing, i)
		}
	}
	for n := 0; n < len(missing); {
		i := missing[n]
		m := n + 1 // extend over consecutive missing chunks within window
		for m < len(missing) && missing[m] == missing[m-1]+1 && l.t.Chunks[missing[m]].Off+l.t.Chunks[missing[m]].Len-l.t.Chunks[i].Off <= window {
			m++
		}
		j := missing[m-1] + 1
		n = m
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := s.fetchRun(ctx, l, i, j, window, sb); err != nil {
				errOnce.Do(func() { first = err })
				return
			}
			if prefetch {
				s.mu.Lock()
				for x := i; x < j; x++ {
					if !l.prefetched[x] {
						l.prefetched[x] = true
						l.st.prefetchChunks.Add(1)
						l.st.prefetchBytes.Add(l.t.Chunks[x].Len)
					}
				}
				s.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// fetchRun makes chunks [i, j) of l present: one ranged read from i, then more from the first
// chunk still missing (a range stops at a chunk in flight elsewhere or repeated inside it).
func (s *Server) fetchRun(ctx context.Context, l *layer, i, j int, window int64, sb *sandbox) error {
	for x := i; x < j; x++ {
		if s.cache.Has(l.t.Chunks[x].Sum) {
			continue
		}
		c, end := s.startFetch(l, x, j, window, sb, false)
		if c == nil {
			continue // stored since Has was asked
		}
		select {
		case <-c.stored:
		case <-ctx.Done():
			return ctx.Err()
		}
		if c.err != nil {
			return c.err
		}
		x = end - 1 // the range is fetched, stored or not (a full cache serves without storing)
	}
	return nil
}

// catchUpFill fetches the rest of l the way eager does (Parallel ranged reads of up to 4x
// FetchWindow), for a layer whose reads missed too much to be served one miss at a time.
func (s *Server) catchUpFill(l *layer) {
	var missing []int
	var bytes int64
	for i, c := range l.t.Chunks {
		if !s.cache.Has(c.Sum) {
			missing = append(missing, i)
			bytes += c.Len
		}
	}
	if st := s.cache.Stats(); bytes > st.Limit-st.PinnedBytes || !s.inUse(l) {
		// It would push out every other layer's chunks (or nobody reads it any more).
		s.cfg.Log.Info("no catch-up fill: the rest of the layer does not fit beside the pinned chunks, or no sandbox uses it",
			"layer", l.name, "missing_bytes", bytes, "cache_limit", st.Limit, "pinned_bytes", st.PinnedBytes)
		return
	}
	start := time.Now()
	s.cfg.Log.Info("reads missed much of a layer: fetching the rest at once", "layer", l.name,
		"demand_bytes", l.st.demandBytes.Load(), "data_size", l.t.DataSize, "chunks_left", len(missing))
	if err := s.fetchChunks(s.ctx, l, missing, 4*s.cfg.FetchWindow, false, nil); err != nil {
		s.cfg.Log.Warn("catch-up fill stopped; reads fetch what they need", "layer", l.name, "err", err)
		s.mu.Lock()
		l.catchUp = false // a later miss may start it again
		s.mu.Unlock()
		return
	}
	s.cfg.Log.Info("catch-up fill done", "layer", l.name, "took", time.Since(start).Round(time.Millisecond))
}

// fill fetches l's remaining chunks in order at most rate bytes per second, until every chunk is
// cached or the server closes.
func (s *Server) fill(l *layer, rate int64) {
	s.mu.Lock()
	if l.filling {
		s.mu.Unlock()
		return
	}
	l.filling = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		l.filling = false
		s.mu.Unlock()
	}()
	start := time.Now()
	var sent int64
	window := min(s.cfg.FetchWindow, max(rate, 64<<10))
	for i := 0; i < len(l.t.Chunks); {
		if s.cache.Has(l.t.Chunks[i].Sum) {
			i++
			continue
		}
		j := i + 1
		for j < len(l.t.Chunks) && l.t.Chunks[j].Off+l.t.Chunks[j].Len-l.t.Chunks[i].Off <= window && !s.cache.Has(l.t.Chunks[j].Sum) {
			j++
		}
		if !s.inUse(l) {
			s.cfg.Log.Info("background fill stopped: no sandbox uses the layer any more", "layer", l.name)
			return
		}
		if err := s.fetchRun(s.ctx, l, i, j, window, nil); err != nil {
			if s.ctx.Err() == nil {
				s.cfg.Log.Warn("background fill stopped", "layer", l.name, "err", err)
			}
			return
		}
		n := l.t.Chunks[j-1].Off + l.t.Chunks[j-1].Len - l.t.Chunks[i].Off
		l.st.fillBytes.Add(n)
		sent += n
		i = j
		// Pace: sleep until sent bytes fit under rate.
		if ahead := time.Duration(float64(sent)/float64(rate)*float64(time.Second)) - time.Since(start); ahead > 0 {
			select {
			case <-time.After(ahead):
			case <-s.ctx.Done():
				return
			}
		}
	}
	s.cfg.Log.Info("layer fully cached by background fill", "layer", l.name, "took", time.Since(start).Round(time.Millisecond))
}

// profilePath is where the prefetch profile of environment key for layer name lives.
func (s *Server) profilePath(key, name string) string {
	return filepath.Join(s.cfg.Dir, profilesDir, hashKey(key), name+".json")
}

// hashKey names the directory of a key's profiles.
func hashKey(key string) string {
	h := sha256.Sum256([]byte(key))
	return fmt.Sprintf("%x", h[:16])
}

// readProfile returns the recorded chunk indices of layer l for key (nil when none): this
// node's copy, else the fleet's in the blob store (kept locally after).
func (s *Server) readProfile(ctx context.Context, key string, l *layer) []int {
	local := s.profilePath(key, l.name)
	b, err := os.ReadFile(local)
	if err != nil {
		ctx, cancel := context.WithTimeout(ctx, profileTimeout)
		defer cancel()
		rc, gerr := s.cfg.Blobs.Get(ctx, profileKey(key, l.name))
		if gerr != nil {
			if !errors.Is(gerr, errdefs.ErrNotFound) {
				s.cfg.Log.Warn("read a prefetch profile from the blob store", "key", key, "layer", l.name, "err", gerr)
			}
			return nil
		}
		b, err = io.ReadAll(io.LimitReader(rc, maxProfileBytes))
		rc.Close()
		if err != nil {
			return nil
		}
		if err := writeFile(local, b); err != nil {
			s.cfg.Log.Warn("keep a prefetch profile on this node", "key", key, "layer", l.name, "err", err)
		}
	}
	var p profile
	if err := json.Unmarshal(b, &p); err != nil {
		s.cfg.Log.Warn("ignore an unreadable prefetch profile", "key", key, "layer", l.name, "err", err)
		return nil
	}
	seen := make(map[int]bool, len(p.Chunks))
	out := make([]int, 0, min(len(p.Chunks), len(l.t.Chunks)))
	for _, i := range p.Chunks {
		if i >= 0 && i < len(l.t.Chunks) && !seen[i] {
			seen[i] = true
			out = append(out, i)
		}
	}
	return out
}

// profileTimeout bounds each read or write of a profile in the blob store: a profile is an
// optimisation, never worth holding up a create or a delete.
const profileTimeout = 5 * time.Second

// maxProfileBytes bounds a profile read from the blob store.
const maxProfileBytes = 64 << 20

// profileKey is where the fleet's profile of key for layer name lives in the blob store, so that
// a node that never ran the environment prefetches what another node recorded.
func profileKey(key, name string) string { return "profiles/" + hashKey(key) + "/" + name + ".json" }

type profile struct {
	Key      string    `json:"key"`
	Layer    string    `json:"layer"`
	Recorded time.Time `json:"recorded"`
	Chunks   []int     `json:"chunks"`
}

// saveProfile merges what sb recorded into the profiles of its layers.
func (s *Server) saveProfiles(sb *sandbox) {
	s.mu.Lock()
	rec := sb.record
	sb.record = nil
	s.mu.Unlock()
	if len(rec) == 0 {
		return
	}
	s.saveMu.Lock() // one read-merge-write at a time
	defer s.saveMu.Unlock()
	for name, r := range rec {
		if len(r.order) == 0 {
			continue
		}
		l, err := s.layer(name)
		if err != nil {
			continue
		}
		old := s.readProfile(s.ctx, sb.key, l)
		seen := map[int]bool{}
		merged := make([]int, 0, len(old)+len(r.order))
		for _, i := range append(old, r.order...) {
			if !seen[i] {
				seen[i] = true
				merged = append(merged, i)
			}
		}
		p := profile{Key: sb.key, Layer: name, Recorded: time.Now().UTC(), Chunks: merged}
		b, err := json.Marshal(p)
		if err == nil {
			err = writeFile(s.profilePath(sb.key, name), b)
		}
		if err != nil {
			s.cfg.Log.Warn("save a prefetch profile", "key", sb.key, "layer", name, "err", err)
			continue
		}
		ctx, cancel := context.WithTimeout(s.ctx, profileTimeout)
		err = s.cfg.Blobs.Put(ctx, profileKey(sb.key, name), bytes.NewReader(b), int64(len(b)))
		cancel()
		if err != nil {
			s.cfg.Log.Warn("share a prefetch profile in the blob store", "key", sb.key, "layer", name, "err", err)
		}
		s.cfg.Log.Info("prefetch profile recorded", "sandbox", sb.id, "key", sb.key, "layer", name,
			"chunks", len(merged), "new", len(merged)-len(old))
	}
}

// writeFile writes b to path whole or not at all.
func writeFile(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
