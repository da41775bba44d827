//go:build linux

package chunkcache

import (
	"cmp"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
)

// loadWorkers is how many chunk directories Open lists at once.
const loadWorkers = 16

// maxBadLogged bounds the log lines about entries Open deletes; a summary counts the rest.
const maxBadLogged = 10

// load empties tmp, creates the chunk directories that are missing and rebuilds the index from
// the chunk files.
//
// Preconditions: c is not yet shared with anyone.
func (c *Cache) load() error {
	leftovers, err := os.ReadDir(c.tmpDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("list temp files: %w", err)
	}
	for _, de := range leftovers {
		if err := os.RemoveAll(filepath.Join(c.tmpDir, de.Name())); err != nil {
			return fmt.Errorf("remove temp file: %w", err)
		}
	}
	if len(leftovers) > 0 {
		c.log.Info("chunk cache: removed temp files of interrupted writes", "dir", c.tmpDir, "count", len(leftovers))
	}
	for _, d := range []string{c.tmpDir, c.chunksDir} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}

	var bad badEntries
	bad.log = c.log
	// Entries of sha256/ that are not chunk directories.
	top, err := os.ReadDir(c.chunksDir)
	if err != nil {
		return err
	}
	for _, de := range top {
		if !isShard(de.Name()) || !de.IsDir() {
			bad.remove(filepath.Join(c.chunksDir, de.Name()), "not a chunk directory")
		}
	}

	var (
		wg      sync.WaitGroup
		next    = make(chan int)
		mu      sync.Mutex // guards the three below
		found   []*entry
		created bool
		firstEr error
	)
	for range loadWorkers {
		wg.Go(func() {
			for b := range next {
				es, made, err := c.loadShard(byte(b), &bad)
				mu.Lock()
				found = append(found, es...)
				created = created || made
				if err != nil && firstEr == nil {
					firstEr = err
				}
				mu.Unlock()
			}
		})
	}
	for b := range 256 {
		next <- b
	}
	close(next)
	wg.Wait()
	if firstEr != nil {
		return firstEr
	}
	if created {
		if err := syncDir(c.chunksDir); err != nil {
			return err
		}
	}
	bad.summary()

	// Oldest first, so that pushing each to the front leaves the newest there.
	slices.SortFunc(found, func(a, b *entry) int {
		if a.mtime != b.mtime {
			return cmp.Compare(a.mtime, b.mtime)
		}
		return compareDigests(a.digest, b.digest)
	})
	for _, e := range found {
		c.entries[e.digest] = e
		c.bytes += e.size
		c.lru.pushFront(e)
	}
	return nil
}

// loadShard lists the chunk directory of first byte b, creating it if it is missing.
func (c *Cache) loadShard(b byte, bad *badEntries) (found []*entry, created bool, err error) {
	name := hex.EncodeToString([]byte{b})
	dir := filepath.Join(c.chunksDir, name)
	des, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.Mkdir(dir, 0o700); err != nil {
			return nil, false, err
		}
		return nil, true, nil
	}
	if err != nil {
		return nil, false, err
	}
	for _, de := range des {
		p := filepath.Join(dir, de.Name())
		d, ok := parseDigest(de.Name())
		if !ok || d[0] != b {
			bad.remove(p, "not a chunk name, or in the wrong directory")
			continue
		}
		if !de.Type().IsRegular() {
			bad.remove(p, "not a regular file")
			continue
		}
		fi, err := de.Info()
		if err != nil {
			return nil, false, err
		}
		if fi.Size() <= 0 || fi.Size() > MaxChunkSize {
			bad.remove(p, fmt.Sprintf("size %d is not that of a chunk", fi.Size()))
			continue
		}
		t := fi.ModTime().UnixNano()
		found = append(found, &entry{digest: d, size: fi.Size(), atime: t, mtime: t})
	}
	return found, false, nil
}

// badEntries removes and logs what Open finds that is not a chunk.
type badEntries struct {
	log     *slog.Logger
	mu      sync.Mutex
	removed int
}

func (b *badEntries) remove(path, why string) {
	err := os.RemoveAll(path)
	b.mu.Lock()
	n := b.removed
	if err == nil {
		b.removed++
	}
	b.mu.Unlock()
	if err != nil {
		b.log.Error("chunk cache: could not remove an entry that is not a chunk", "path", path, "why", why, "err", err)
	} else if n < maxBadLogged {
		b.log.Warn("chunk cache: removed an entry that is not a chunk", "path", path, "why", why)
	}
}

func (b *badEntries) summary() {
	if b.removed > maxBadLogged {
		b.log.Warn("chunk cache: removed entries that were not chunks", "count", b.removed)
	}
}

// parseDigest parses a chunk file name: 64 lowercase hex digits.
func parseDigest(name string) ([32]byte, bool) {
	var d [32]byte
	if len(name) != 64 || !lowerHex(name) {
		return d, false
	}
	_, err := hex.Decode(d[:], []byte(name))
	return d, err == nil
}

// isShard reports whether name is that of a chunk directory: 2 lowercase hex digits.
func isShard(name string) bool { return len(name) == 2 && lowerHex(name) }

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if ch := s[i]; !('0' <= ch && ch <= '9' || 'a' <= ch && ch <= 'f') {
			return false
		}
	}
	return true
}

// syncDir fsyncs a directory, making the renames into it durable.
func syncDir(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}
