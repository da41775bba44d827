//go:build linux

package layers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lazy"
)

// maxTableBytes bounds a chunk table read from the blob store.
const maxTableBytes = 256 << 20

// lazyDir is lazyd's directory under the store's.
func (s *Store) lazyDir() string { return filepath.Join(s.cfg.Dir, "lazy") }

// lazyClient returns the client of this node's lazyd, starting lazyd on first use.
func (s *Store) lazyClient(ctx context.Context) (*lazy.Client, error) {
	s.lazyMu.Lock()
	defer s.lazyMu.Unlock()
	if s.lazyc != nil && !s.lazyc.Dead() {
		return s.lazyc, nil
	}
	if s.lazyc != nil {
		s.log.Warn("lazyd went away; reaching or starting another")
		s.lazyc.Drop()
		s.lazyc = nil
		// Lingering layers (Config.Linger) were mounted through the lazyd that went: a mount
		// whose FUSE file did not survive it must not be handed to the next sandbox.
		if n, err := s.mounts.Sweep(); err != nil || n > 0 {
			s.log.Info("unmounted lingering layers of the lazyd that went", "count", n, "err", err)
		}
	}
	if s.cfg.Lazy.Command == nil && s.lazyDone != nil {
		select {
		case err := <-s.lazyDone: // the one served in this process exited: serve another
			if err != nil {
				s.log.Error("lazyd in this process", "err", err)
			}
			s.lazyStop()
			s.lazyStop, s.lazyDone = nil, nil
		default:
		}
	}
	if s.cfg.Lazy.Command == nil && s.lazyDone == nil {
		runCtx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		cfg := lazy.Config{Dir: s.lazyDir(), Blobs: s.blobs, CacheMax: s.cfg.Lazy.CacheMax, ReadTimeout: s.cfg.Lazy.ReadTimeout, Log: s.log.With("component", "lazyd")}
		go func() { done <- lazy.Run(runCtx, cfg) }()
		s.lazyStop, s.lazyDone = stop, done
	}
	c, err := lazy.StartRetrying(ctx, lazy.StartOptions{Dir: s.lazyDir(), BlobStore: s.blobs.String(), Command: s.cfg.Lazy.Command, Log: s.log})
	if err != nil {
		return nil, fmt.Errorf("layer data server: %w", err)
	}
	s.lazyc = c
	return c, nil
}

// closeLazy lets go of lazyd; one served in this process is stopped once nothing is mounted
// through it (waiting up to 10 s).
func (s *Store) closeLazy() {
	s.lazyMu.Lock()
	defer s.lazyMu.Unlock()
	if s.lazyc != nil {
		s.lazyc.Close()
		s.lazyc = nil
	}
	if s.lazyStop != nil {
		s.lazyStop()
		select {
		case err := <-s.lazyDone:
			if err != nil {
				s.log.Error("lazyd in this process", "err", err)
			}
		case <-time.After(10 * time.Second):
			s.log.Warn("lazyd in this process still serves mounted layers; it stops with the process")
		}
		s.lazyStop, s.lazyDone = nil, nil
	}
}

// ensureTable puts m's chunk table where lazyd reads it, fetched from the blob store and checked
// against the record on first use.
func (s *Store) ensureTable(ctx context.Context, c *lazy.Client, m blobMeta) (string, error) {
	name, _ := ParseDigest(m.Image)
	p := c.TablePath(name)
	if _, err := os.Stat(p); err == nil {
		return name, nil
	}
	thex, _ := ParseDigest(m.Table)
	rc, err := s.blobs.Get(ctx, tableKey(thex))
	if err != nil {
		return "", fmt.Errorf("fetch chunk table %s from %s: %w", m.Table, s.blobs, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxTableBytes+1))
	if err != nil {
		return "", fmt.Errorf("fetch chunk table %s from %s: %w", m.Table, s.blobs, err)
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != thex || int64(len(b)) != m.TableSize {
		return "", fmt.Errorf("chunk table %s from %s: got %d bytes that do not hash to the record's digest (corrupt or replaced in the blob store)", m.Table, s.blobs, len(b))
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return "", err
	}
	// Concurrent first creates may each fetch it: each writes its own temp file and renames it
	// over the others (the content is the same, checked against one digest).
	f, err := os.CreateTemp(filepath.Dir(p), ".table-*")
	if err != nil {
		return "", err
	}
	_, werr := f.Write(b)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(f.Name(), p)
	}
	if werr != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("store chunk table %s: %w", m.Table, werr)
	}
	return name, nil
}

// acquireSplit mounts a split layer: its metadata image, local, with its data blob served by
// lazyd as the image's extra device.
func (s *Store) acquireSplit(ctx context.Context, m blobMeta, img string) (string, error) {
	c, err := s.lazyClient(ctx)
	if err != nil {
		return "", err
	}
	name, err := s.ensureTable(ctx, c, m)
	if err != nil {
		return "", err
	}
	hexd, _ := ParseDigest(m.Digest)
	return s.mounts.AcquireDevices(hexd, img, []string{c.BlobPath(name)})
}

// Fetch says how a sandbox's layers are fetched.
type Fetch struct {
	Sandbox string // the sandbox's ID
	// Key names its environment: start-up reads are recorded, and prefetched, per key.
	Key  string
	Mode string // lazy.ModeEager, lazy.ModeLazy, lazy.ModePrefetch; "" takes Config.Lazy.Mode
	// FillRate overrides Config.Lazy.FillRate per layer digest.
	FillRate map[string]int64
}

// Prepare starts fetching a sandbox's layers (digests) as f says, before they are acquired: in
// eager mode it returns once all their data is in the node's cache. Layers stored whole have
// nothing to fetch.
func (s *Store) Prepare(ctx context.Context, digests []string, f Fetch) error {
	err := s.prepare(ctx, digests, f)
	if errors.Is(err, errdefs.ErrUnavailable) && s.lazyDead() {
		// lazyd died since it was last reached: once more, with a new one.
		s.log.Warn("lazyd was gone when a sandbox's layers were registered; starting another", "sandbox", f.Sandbox, "err", err)
		err = s.prepare(ctx, digests, f)
	}
	if errors.Is(err, errdefs.ErrExhausted) {
		// A mounted layer pins its chunks in lazyd's cache, lingering ones too: unmount those
		// no sandbox uses and try once more.
		if n, serr := s.mounts.Sweep(); n > 0 {
			s.log.Info("chunk cache full: unmounted lingering layers", "sandbox", f.Sandbox, "count", n, "err", serr)
			// lazyd unpins a layer's chunks when the kernel releases its file, just after the
			// unmount returns: try again until it has, for a bounded time.
			deadline := time.Now().Add(unpinWait)
			for wait := 10 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
				err = s.prepare(ctx, digests, f)
				if !errors.Is(err, errdefs.ErrExhausted) || time.Now().After(deadline) || ctx.Err() != nil {
					break
				}
				select {
				case <-time.After(wait):
				case <-ctx.Done():
				}
			}
		}
	}
	return err
}

// unpinWait bounds Prepare's wait for lazyd to unpin the chunks of the layers it unmounted.
const unpinWait = 2 * time.Second

// lazyDead reports whether the current lazyd client found its server gone.
func (s *Store) lazyDead() bool {
	s.lazyMu.Lock()
	defer s.lazyMu.Unlock()
	return s.lazyc != nil && s.lazyc.Dead()
}

func (s *Store) prepare(ctx context.Context, digests []string, f Fetch) error {
	mode := f.Mode
	if mode == "" {
		mode = s.cfg.Lazy.Mode
	}
	if !lazy.ValidMode(mode) {
		return errdefs.Invalid("fetch", "must be eager, lazy or prefetch, got %q", mode)
	}
	req := lazy.SandboxRequest{ID: f.Sandbox, Key: f.Key, Mode: mode, RecordSeconds: s.cfg.Lazy.RecordSeconds, FillRate: map[string]int64{}}
	var c *lazy.Client
	for _, d := range digests {
		m, err := s.meta(ctx, d)
		if err != nil {
			return fmt.Errorf("fetch layer: %w", err)
		}
		if m.Format != formatSplit {
			continue
		}
		if c == nil {
			if c, err = s.lazyClient(ctx); err != nil {
				return err
			}
		}
		name, err := s.ensureTable(ctx, c, m)
		if err != nil {
			return err
		}
		req.Layers = append(req.Layers, name)
		rate, ok := f.FillRate[d]
		if !ok {
			rate = s.cfg.Lazy.FillRate
		}
		if rate > 0 {
			req.FillRate[name] = rate
		}
	}
	if c == nil {
		return nil
	}
	if err := c.Register(ctx, req); err != nil {
		return fmt.Errorf("fetch layers (%s): %w", mode, err)
	}
	return nil
}

// runningLazy returns the lazyd client when one is connected or a lazyd serves this node (one
// that outlived a restart of this process); nil otherwise. It never starts one: ending the
// fetching of a sandbox is no reason to.
func (s *Store) runningLazy(ctx context.Context) *lazy.Client {
	s.lazyMu.Lock()
	defer s.lazyMu.Unlock()
	if s.lazyc != nil && !s.lazyc.Dead() {
		return s.lazyc
	}
	c, err := lazy.Start(ctx, lazy.StartOptions{Dir: s.lazyDir(), BlobStore: s.blobs.String(), NoStart: true, Log: s.log})
	if err != nil {
		return nil
	}
	s.lazyc = c
	return c
}

// Finish ends a sandbox's fetching (its profile is saved) and returns its statistics; a sandbox
// with nothing fetched lazily returns errdefs.ErrNotFound.
func (s *Store) Finish(ctx context.Context, sandbox string) (lazy.Stats, error) {
	c := s.runningLazy(ctx)
	if c == nil {
		return lazy.Stats{}, errdefs.NotFound("fetch statistics of sandbox %s", sandbox)
	}
	return c.Unregister(ctx, sandbox)
}

// SandboxStats returns a running sandbox's fetch statistics (errdefs.ErrNotFound when none).
func (s *Store) SandboxStats(ctx context.Context, sandbox string) (lazy.Stats, error) {
	c := s.runningLazy(ctx)
	if c == nil {
		return lazy.Stats{}, errdefs.NotFound("fetch statistics of sandbox %s", sandbox)
	}
	return c.SandboxStats(ctx, sandbox)
}

// LayerStats are a layer's storage and, for split layers, its fetch statistics on this node.
type LayerStats struct {
	Digest    string
	Format    string
	ImageSize int64
	DataSize  int64
	// Fetch and Cache are nil for a layer stored whole (imported before lazy loading).
	Fetch *lazy.Stats
	Cache *lazy.CacheStats
}

// Stats describes a layer on this node.
func (s *Store) Stats(ctx context.Context, digest string) (LayerStats, error) {
	m, err := s.meta(ctx, digest)
	if err != nil {
		return LayerStats{}, err
	}
	st := LayerStats{Digest: m.Digest, Format: m.Format, ImageSize: m.ImageSize, DataSize: m.DataSize}
	if m.Format != formatSplit {
		return st, nil
	}
	c, err := s.lazyClient(ctx)
	if err != nil {
		return st, err
	}
	name, err := s.ensureTable(ctx, c, m)
	if err != nil {
		return st, err
	}
	ls, err := c.LayerStats(ctx, name)
	if err != nil {
		return st, err
	}
	cs, err := c.CacheStats(ctx)
	if err != nil {
		return st, err
	}
	st.Fetch, st.Cache = &ls, &cs
	return st, nil
}

// removeSplitData deletes a removed split layer's data blob and table unless another record
// names them (two layers that differ only in metadata share their data).
func (s *Store) removeSplitData(ctx context.Context, m blobMeta) {
	blobs, err := s.List(ctx)
	if err != nil {
		s.log.Warn("keep a removed layer's data for the next collection", "digest", m.Digest, "err", err)
		return
	}
	for _, b := range blobs {
		if o, err := s.meta(ctx, b.Digest); err == nil && o.Digest != m.Digest && (o.Data == m.Data || o.Table == m.Table) {
			return
		}
	}
	dhex, _ := ParseDigest(m.Data)
	thex, _ := ParseDigest(m.Table)
	for _, k := range []string{dataKey(dhex), tableKey(thex)} {
		if err := s.blobs.Delete(ctx, k); err != nil {
			s.log.Error("delete a removed layer's data", "digest", m.Digest, "key", k, "err", err)
		}
	}
	ihex, _ := ParseDigest(m.Image)
	if err := os.Remove(filepath.Join(s.lazyDir(), "tables", ihex+".json")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("delete a removed layer's local chunk table", "digest", m.Digest, "err", err)
	}
}

// FetchMetrics returns the node's chunk cache totals and every served layer's fetch statistics,
// when lazyd runs and this process holds it (a scrape never starts one). ok is false otherwise.
func (s *Store) FetchMetrics(ctx context.Context) (cache lazy.CacheStats, layers []lazy.Stats, ok bool) {
	if !s.lazyMu.TryLock() {
		return cache, nil, false // lazyd is being started or stopped: no figures this scrape
	}
	c := s.lazyc
	s.lazyMu.Unlock()
	if c == nil || c.Dead() {
		return cache, nil, false
	}
	var err error
	if cache, err = c.CacheStats(ctx); err != nil {
		return cache, nil, false
	}
	if layers, err = c.AllLayerStats(ctx); err != nil {
		return cache, nil, false
	}
	return cache, layers, true
}
