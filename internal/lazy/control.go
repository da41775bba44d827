//go:build linux

package lazy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// ProtocolVersion names the control API; a client refuses a server that speaks another.
const ProtocolVersion = 1

// Info is what GET /v1/info answers.
type Info struct {
	Protocol  int    `json:"protocol"`
	Pid       int    `json:"pid"`
	BlobStore string `json:"blob_store"`
	Mount     string `json:"mount"`
	// Closing: the server decided to exit (a starting one waits for its lock).
	Closing bool `json:"closing,omitempty"`
}

// SandboxRequest registers a sandbox about to start on lazily fetched layers.
type SandboxRequest struct {
	ID string `json:"id"`
	// Key names the sandbox's environment: prefetch profiles are kept per key and layer.
	Key    string   `json:"key"`
	Layers []string `json:"layers"` // layer names (hex of their metadata image)
	Mode   string   `json:"mode"`   // ModeEager, ModeLazy or ModePrefetch
	// RecordSeconds is how long the sandbox's reads are recorded into its profile (0: not).
	RecordSeconds int `json:"record_seconds"`
	// FillRate, in prefetch mode, fetches the rest of a layer (by name) in the background at
	// most this many bytes per second after its profile; a layer not named gets nothing more.
	FillRate map[string]int64 `json:"fill_rate,omitempty"`
}

// Stats are a layer's or a sandbox's fetch statistics. The control API carries them as this
// JSON, which a daemon reads from the lazyd it finds running, perhaps one started by an older
// corrald: a field may be added, never renamed. The HTTP API's FetchStats has the same fields
// (internal/apiserver converts).
type Stats struct {
	Layer   string `json:"layer,omitempty"`   // the layer's name (hex of its metadata image), for a layer
	Sandbox string `json:"sandbox,omitempty"` // the sandbox ID, for a sandbox
	// DataSize and Chunks describe the layer's data blob; CachedChunks and CachedBytes how much
	// of it the chunk cache holds; Open how many mounts read it now.
	DataSize     int64 `json:"data_size,omitempty"`
	Chunks       int   `json:"chunks,omitempty"`
	CachedChunks int   `json:"cached_chunks,omitempty"`
	CachedBytes  int64 `json:"cached_bytes"`
	Open         int   `json:"open,omitempty"`
	// BytesRead were served to the kernel; Hits and Misses count chunk reads found in, or
	// missing from, the cache.
	BytesRead int64 `json:"bytes_read"`
	Hits      int64 `json:"cache_hits"`
	Misses    int64 `json:"cache_misses"`
	// BytesFetched and Fetches count ranged reads of the blob store; FetchErrors the failed ones
	// (retried), Corrupt the chunks that did not match their SHA-256 (refetched), ReadErrors the
	// reads answered with EIO.
	BytesFetched int64 `json:"bytes_fetched"`
	Fetches      int64 `json:"fetches"`
	FetchErrors  int64 `json:"fetch_errors"`
	Corrupt      int64 `json:"corrupt_chunks"`
	ReadErrors   int64 `json:"read_errors"`
	// FillBytes were fetched by the background fill.
	FillBytes    int64            `json:"fill_bytes"`
	Prefetch     PrefetchStats    `json:"prefetch"`
	FetchLatency LatencyHistogram `json:"fetch_latency"`
	LastError    string           `json:"last_error,omitempty"`
	LastErrorAt  time.Time        `json:"last_error_at,omitzero"`
}

// PrefetchStats say how much prefetch fetched and how much of it was then read.
type PrefetchStats struct {
	Chunks int64 `json:"chunks"`
	Bytes  int64 `json:"bytes"`
	Used   int64 `json:"used_chunks"`
	// Effectiveness is Used / Chunks: the share of prefetched chunks that were then read.
	Effectiveness float64 `json:"effectiveness"`
}

// LatencyHistogram counts fetch latencies in buckets with upper bounds BoundsMs (one more count
// for everything above the last bound).
type LatencyHistogram struct {
	BoundsMs []float64 `json:"bounds_ms"`
	Counts   []int64   `json:"counts"`
	// P50Ms and P99Ms are the upper bounds of the buckets holding those quantiles (-1: above
	// the last bound).
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
}

// CacheStats describe the node's chunk cache (the control API's JSON, compatible as Stats is).
type CacheStats struct {
	Bytes        int64 `json:"bytes"`
	Limit        int64 `json:"limit"`
	Chunks       int64 `json:"chunks"`
	PinnedBytes  int64 `json:"pinned_bytes"`
	Evictions    int64 `json:"evictions"`
	EvictedBytes int64 `json:"evicted_bytes"`
	Corrupt      int64 `json:"corrupt"`
	Bypassed     int64 `json:"bypassed"`
}

func (c *counters) stats() Stats {
	st := Stats{BytesRead: c.bytesRead.Load(), Hits: c.hits.Load(), Misses: c.misses.Load(),
		BytesFetched: c.bytesFetched.Load(), Fetches: c.fetches.Load(), FetchErrors: c.fetchErrors.Load(),
		Corrupt: c.corrupt.Load(), ReadErrors: c.readErrors.Load(), FillBytes: c.fillBytes.Load(),
		Prefetch:     PrefetchStats{Chunks: c.prefetchChunks.Load(), Bytes: c.prefetchBytes.Load(), Used: c.used.Load()},
		FetchLatency: c.lat.snapshot()}
	if st.Prefetch.Chunks > 0 {
		st.Prefetch.Effectiveness = float64(st.Prefetch.Used) / float64(st.Prefetch.Chunks)
	}
	if e := c.lastErr.Load(); e != nil {
		st.LastError, st.LastErrorAt = e.Err, e.At
	}
	return st
}

var bucketsMs = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000}

type histogram struct {
	counts [14]atomic.Int64 // len(bucketsMs)+1
}

func (h *histogram) observe(d time.Duration) {
	ms := float64(d) / float64(time.Millisecond)
	i, _ := slices.BinarySearch(bucketsMs, ms)
	h.counts[i].Add(1)
}

func (h *histogram) snapshot() LatencyHistogram {
	out := LatencyHistogram{BoundsMs: bucketsMs, Counts: make([]int64, len(h.counts))}
	var total int64
	for i := range h.counts {
		out.Counts[i] = h.counts[i].Load()
		total += out.Counts[i]
	}
	q := func(p float64) float64 {
		if total == 0 {
			return 0
		}
		want, run := int64(float64(total)*p+0.5), int64(0)
		for i, c := range out.Counts {
			run += c
			if run >= max(want, 1) {
				if i < len(bucketsMs) {
					return bucketsMs[i]
				}
				return -1 // beyond the last bound
			}
		}
		return -1
	}
	out.P50Ms, out.P99Ms = q(0.5), q(0.99)
	return out
}

// layerStats describes l, with how much of it the cache holds.
func (s *Server) layerStats(l *layer) Stats {
	st := l.st.stats()
	st.Layer, st.DataSize, st.Chunks = l.name, l.t.DataSize, len(l.t.Chunks)
	for _, c := range l.t.Chunks {
		if s.cache.Has(c.Sum) {
			st.CachedChunks++
			st.CachedBytes += c.Len
		}
	}
	s.mu.Lock()
	st.Open = l.opens
	s.mu.Unlock()
	return st
}

// register starts a sandbox's fetching as req says. In eager mode it returns once every chunk of
// its layers is cached (or ctx ends); otherwise at once, with prefetch running behind.
func (s *Server) register(ctx context.Context, req SandboxRequest) error {
	if req.ID == "" || len(req.ID) > 128 || strings.ContainsAny(req.ID, "/\x00") {
		return errdefs.Invalid("id", "%q is not a sandbox ID", req.ID)
	}
	if !ValidMode(req.Mode) {
		return errdefs.Invalid("mode", "%q is not eager, lazy or prefetch", req.Mode)
	}
	for name, rate := range req.FillRate {
		if rate < 0 || !nameRE.MatchString(name) {
			return errdefs.Invalid("fill_rate", "%s: %d: want a layer name and bytes per second >= 0", name, rate)
		}
	}
	if req.RecordSeconds < 0 || req.RecordSeconds > 600 || len(req.Layers) > 128 || len(req.Key) > 1024 {
		return errdefs.Invalid("request", "record_seconds must be 0-600, fill_rate >= 0, at most 128 layers and a key of at most 1024 bytes")
	}
	ls := make([]*layer, len(req.Layers))
	for i, name := range req.Layers {
		l, err := s.layer(name)
		if err != nil {
			return err
		}
		ls[i] = l
	}
	sb := &sandbox{id: req.ID, key: req.Key, layers: req.Layers}
	if req.RecordSeconds > 0 && req.Key != "" && req.Mode != ModeEager {
		sb.recordUntil = time.Now().Add(time.Duration(req.RecordSeconds) * time.Second)
		sb.record = map[string]*recording{}
		for _, name := range req.Layers {
			sb.record[name] = &recording{seen: map[int]bool{}}
		}
		sb.timer = time.AfterFunc(time.Duration(req.RecordSeconds)*time.Second, func() { s.saveProfiles(sb) })
	}
	s.mu.Lock()
	s.sandboxes[req.ID] = sb
	s.mu.Unlock()
	switch req.Mode {
	case ModeEager:
		// The sandbox's chunks are pinned from now until it ends: what eager fetched stays on
		// the node even before the layers are mounted.
		var sums [][32]byte
		for _, l := range ls {
			sums = append(sums, l.sums()...)
		}
		s.cache.Pin(pinOwner(req.ID), sums)
		start := time.Now()
		for _, l := range ls {
			all := make([]int, len(l.t.Chunks))
			for i := range all {
				all[i] = i
			}
			if err := s.fetchChunks(ctx, l, all, 4*s.cfg.FetchWindow, false, sb); err != nil {
				return fmt.Errorf("fetch layer %s before start: %w", l.name, err)
			}
			for _, c := range l.t.Chunks {
				if !s.cache.Has(c.Sum) {
					st := s.cache.Stats()
					return fmt.Errorf("fetch layer %s before start: the node's chunk cache cannot hold it (%d bytes; cache %d of %d bytes used, %d pinned by mounted layers; corral up --cache-size): %w",
						l.name, l.t.DataSize, st.Bytes, st.Limit, st.PinnedBytes, errdefs.ErrExhausted)
				}
			}
		}
		s.cfg.Log.Info("layers fetched before start", "sandbox", req.ID, "layers", len(ls), "took", time.Since(start).Round(time.Millisecond))
	case ModePrefetch:
		for _, l := range ls {
			go func() {
				// In the order the profile recorded: what the sandbox reads first comes first.
				prof := s.readProfile(s.ctx, req.Key, l)
				start := time.Now()
				if len(prof) > 0 {
					if err := s.fetchChunks(s.ctx, l, prof, s.cfg.FetchWindow, true, sb); err != nil {
						s.cfg.Log.Warn("prefetch failed; reads fetch what they need", "sandbox", req.ID, "layer", l.name, "err", err)
						return
					}
					s.cfg.Log.Info("prefetched the recorded start-up set", "sandbox", req.ID, "layer", l.name,
						"chunks", len(prof), "took", time.Since(start).Round(time.Millisecond))
				}
				if rate := req.FillRate[l.name]; rate > 0 {
					s.fill(l, rate)
				}
			}()
		}
	}
	return nil
}

// pinOwner names a sandbox's pins in the chunk cache (eager mode).
func pinOwner(id string) string { return "sandbox:" + id }

// unregister forgets a sandbox, saving what it recorded, and returns its statistics.
func (s *Server) unregister(id string) (Stats, error) {
	s.mu.Lock()
	sb := s.sandboxes[id]
	delete(s.sandboxes, id)
	s.mu.Unlock()
	if sb == nil {
		return Stats{}, fmt.Errorf("sandbox %s is not registered: %w", id, errdefs.ErrNotFound)
	}
	if sb.timer != nil {
		sb.timer.Stop()
	}
	s.cache.Unpin(pinOwner(id))
	go s.saveProfiles(sb) // the blob store may be slow: a delete does not wait for it
	st := sb.st.stats()
	st.Sandbox = id
	return st, nil
}

func (s *Server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		closing := s.closing
		s.mu.Unlock()
		reply(w, Info{Protocol: ProtocolVersion, Pid: os.Getpid(), BlobStore: s.cfg.Blobs.String(), Mount: filepath.Join(s.cfg.Dir, mntDir), Closing: closing}, nil)
	})
	mux.HandleFunc("GET /v1/hold", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			reply(w, nil, fmt.Errorf("lazyd is exiting: %w", errdefs.ErrUnavailable))
			return
		}
		s.holds++
		s.mu.Unlock()
		s.everHeld.Store(true)
		s.exitWhenIdle.Store(false) // a client again: exit only once it lets go
		defer func() {
			s.mu.Lock()
			s.holds--
			s.mu.Unlock()
			s.pokeIdle()
		}()
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	mux.HandleFunc("POST /v1/exit", func(w http.ResponseWriter, r *http.Request) {
		s.exitWhenIdle.Store(true)
		s.pokeIdle()
		reply(w, exitReply{Open: s.openFiles()}, nil)
	})
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var req SandboxRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
			reply(w, nil, errdefs.Invalid("body", "%v", err))
			return
		}
		reply(w, struct{}{}, s.register(r.Context(), req))
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		st, err := s.unregister(r.PathValue("id"))
		reply(w, st, err)
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		sb := s.sandboxes[r.PathValue("id")]
		s.mu.Unlock()
		if sb == nil {
			reply(w, nil, fmt.Errorf("sandbox %s is not registered: %w", r.PathValue("id"), errdefs.ErrNotFound))
			return
		}
		st := sb.st.stats()
		st.Sandbox = sb.id
		reply(w, st, nil)
	})
	mux.HandleFunc("GET /v1/layers/{name}", func(w http.ResponseWriter, r *http.Request) {
		l, err := s.layer(r.PathValue("name"))
		if err != nil {
			reply(w, nil, err)
			return
		}
		reply(w, s.layerStats(l), nil)
	})
	mux.HandleFunc("GET /v1/layers", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		ls := make([]*layer, 0, len(s.layers))
		for _, l := range s.layers {
			ls = append(ls, l)
		}
		s.mu.Unlock()
		slices.SortFunc(ls, func(a, b *layer) int { return strings.Compare(a.name, b.name) })
		out := make([]Stats, len(ls))
		for i, l := range ls {
			out[i] = s.layerStats(l)
		}
		reply(w, out, nil)
	})
	mux.HandleFunc("GET /v1/cache", func(w http.ResponseWriter, r *http.Request) {
		c := s.cache.Stats()
		reply(w, CacheStats{Bytes: c.Bytes, Limit: c.Limit, Chunks: c.Chunks, PinnedBytes: c.PinnedBytes,
			Evictions: c.Evictions, EvictedBytes: c.EvictedBytes, Corrupt: c.CorruptDetected, Bypassed: c.Bypassed}, nil)
	})
	return mux
}

// tryClose marks the server closing if nothing holds it and no blob file is open, so that no
// hold is accepted between the decision and the exit.
func (s *Server) tryClose() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.holds > 0 || s.openFilesLocked() > 0 {
		return false
	}
	s.closing = true
	return true
}

// exitReply answers POST /v1/exit: the server exits once no blob file is open and no client
// holds it; Open says how many files are open now.
type exitReply struct {
	Open int `json:"open"`
}

type errorBody struct {
	Error string `json:"error"`
	Kind  string `json:"kind"`
}

func reply(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		code, kind := http.StatusInternalServerError, "internal"
		switch {
		case errors.Is(err, errdefs.ErrInvalid):
			code, kind = http.StatusBadRequest, "invalid"
		case errors.Is(err, errdefs.ErrNotFound):
			code, kind = http.StatusNotFound, "not_found"
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, errTimeout):
			code, kind = http.StatusServiceUnavailable, "unavailable"
		case errors.Is(err, errdefs.ErrExhausted):
			code, kind = http.StatusInsufficientStorage, "exhausted"
		}
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(errorBody{Error: err.Error(), Kind: kind})
		return
	}
	json.NewEncoder(w).Encode(v)
}

// Run serves cfg until the server is idle (no blob file open, no client holding it): at once
// after a client asked it to exit (Client.Close), else after two seconds idle once a client held
// it, or after startGrace when none ever did. Once ctx ends it exits as soon as it
// is idle. One Run per directory: a second fails with errdefs.ErrConflict.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(cfg.Dir, "lazyd.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	// A lazyd that is exiting (or still starting) may hold the lock for a moment: wait for it,
	// briefly. One that serves and is not exiting wins at once: two may be started at the same
	// time (corral up, and the keeper replacing one that died), and the second must not take
	// over later when the first exits idle.
	probe := newClient(cfg.Dir)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		info, perr := probe.Info(pctx)
		cancel()
		if time.Now().After(deadline) || (perr == nil && !info.Closing) {
			return fmt.Errorf("another lazyd serves %s: %w", cfg.Dir, errdefs.ErrConflict)
		}
	}
	probe.hc.CloseIdleConnections()
	s, err := New(cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	s.resumeOnly = os.Getenv(resumeOnlyEnv) == "1"
	os.Unsetenv(resumeOnlyEnv) // not for the keepers it starts
	fsrv, err := s.mount()
	if errors.Is(err, errNothingToResume) {
		cfg.Log.Info("started to resume a kept FUSE connection, which is gone: exiting")
		return nil
	}
	if err != nil {
		return fmt.Errorf("mount the lazy blob filesystem: %w", err)
	}
	if fsrv.fc.resumed {
		// Taken over from a lazyd that died: nothing may hold this one yet, and it exits once
		// idle as one that was held.
		s.everHeld.Store(true)
	}
	sock := filepath.Join(cfg.Dir, SocketName)
	os.Remove(sock) // ours: the lock says no other server runs
	ln, err := net.Listen("unix", sock)
	if err != nil {
		fsrv.unmount()
		return err
	}
	hs := &http.Server{Handler: s.handler(), ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(ln)
	cfg.Log.Info("lazyd serving", "dir", cfg.Dir, "blob_store", cfg.Blobs.String(), "cache_max", cfg.CacheMax, "pid", os.Getpid())

	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	const startGrace = 15 * time.Second
	started, idleSince, stopping := time.Now(), time.Time{}, false
	for {
		done := ctx.Done()
		if stopping {
			done = nil
		}
		select {
		case <-done:
			stopping = true
			cfg.Log.Info("lazyd asked to stop; it stops once no layer is mounted through it")
		case <-s.idle:
		case <-tick.C:
		}
		if s.busy() {
			idleSince = time.Time{}
			continue
		}
		if idleSince.IsZero() {
			idleSince = time.Now()
		}
		if (stopping || s.exitWhenIdle.Load() || (time.Since(idleSince) >= 2*time.Second && (s.everHeld.Load() || time.Since(started) >= startGrace))) && s.tryClose() {
			break
		}
	}
	cfg.Log.Info("lazyd idle: unmounting and exiting")
	// Unmount before the socket goes: a client waiting for the socket to die then finds the
	// mount gone too.
	uerr := fsrv.unmount()
	hs.Close()
	os.Remove(sock)
	if uerr != nil {
		return fmt.Errorf("unmount the lazy blob filesystem: %w", uerr)
	}
	return nil
}
