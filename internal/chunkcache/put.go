//go:build linux

package chunkcache

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Put stores data as the chunk digest, which must be its sha256, evicting least recently used
// unpinned chunks to make room. It is a no-op (an access) when the chunk is stored already.
// It fails with errdefs.ErrInvalid when data does not match digest or is empty or larger than
// MaxChunkSize, and with errdefs.ErrExhausted, storing nothing, when the chunk cannot fit
// beside the pinned ones (then evicting nothing either) or the disk is full.
func (c *Cache) Put(digest [32]byte, data []byte) error {
	if sum := sha256.Sum256(data); sum != digest {
		return fmt.Errorf("store chunk sha256:%s: the data hashes to sha256:%s: %w",
			hexDigest(digest), hexDigest(sum), errdefs.ErrInvalid)
	}
	return c.PutVerified(digest, data)
}

// PutVerified is Put for a caller that has just checked sha256(data) == digest itself (lazyd
// checks every fetched chunk before serving it): the chunk is not hashed a second time. A
// caller that passes data not matching digest stores a corrupt chunk, which the first read
// after the next Open detects and deletes.
func (c *Cache) PutVerified(digest [32]byte, data []byte) error {
	if len(data) == 0 || len(data) > MaxChunkSize {
		return fmt.Errorf("store chunk sha256:%s: %d bytes, but a chunk has 1 to %d: %w",
			hexDigest(digest), len(data), MaxChunkSize, errdefs.ErrInvalid)
	}
	size := int64(len(data))

	c.mu.Lock()
	if err := c.beginLocked(); err != nil {
		c.mu.Unlock()
		return err
	}
	defer c.ops.Done()
	for {
		if e := c.entries[digest]; e != nil {
			c.touchLocked(e, c.now().UnixNano())
			c.mu.Unlock()
			return nil
		}
		ch := c.busy[digest]
		if ch == nil {
			break
		}
		// Another Put writes it, or an eviction deletes it; see how that ends.
		c.mu.Unlock()
		<-ch
		c.mu.Lock()
	}
	if c.pinnedBytes+c.reserved+size > c.limit {
		err := fmt.Errorf("store chunk sha256:%s: cache full: %d of its %d bytes are pinned by mounted layers and %d being written; unmount layers or raise the limit: %w",
			hexDigest(digest), c.pinnedBytes, c.limit, c.reserved, errdefs.ErrExhausted)
		c.bypassLocked(err)
		return err
	}
	victims := c.evictLocked(size)
	c.reserved += size
	done := make(chan struct{})
	c.busy[digest] = done
	c.mu.Unlock()

	c.finish(victims)
	now := c.now().UnixNano()
	err := c.write(digest, data, now)

	c.mu.Lock()
	delete(c.busy, digest)
	close(done)
	c.reserved -= size
	if err != nil {
		err = fmt.Errorf("store chunk sha256:%s: %w", hexDigest(digest), err)
		if errors.Is(err, errdefs.ErrExhausted) {
			c.bypassLocked(err)
		} else {
			c.mu.Unlock()
		}
		return err
	}
	c.insertLocked(digest, size, now)
	c.stats.Puts++
	c.stats.PutBytes += size
	c.mu.Unlock()
	return nil
}

// bypassLocked counts a Put refused with err and logs it, at most once a minute: a full cache
// refuses Put after Put, and the caller, which serves the bytes anyway, does not log them.
//
// Preconditions: c.mu is held; bypassLocked unlocks it.
func (c *Cache) bypassLocked(err error) {
	c.stats.Bypassed++
	n := c.stats.Bypassed
	now := c.now().UnixNano()
	quiet := c.bypassLogged != 0 && now-c.bypassLogged < int64(time.Minute)
	if !quiet {
		c.bypassLogged = now
	}
	c.mu.Unlock()
	if !quiet {
		c.log.Warn("chunk cache: not storing chunks; reads are served but not cached", "err", err, "bypassed_total", n)
	}
}

// Trim evicts least recently used unpinned chunks until the cache holds at most its limit. It
// fails with errdefs.ErrExhausted when pinned chunks alone exceed the limit.
func (c *Cache) Trim() error {
	c.mu.Lock()
	if err := c.beginLocked(); err != nil {
		c.mu.Unlock()
		return err
	}
	defer c.ops.Done()
	victims := c.evictLocked(0)
	var err error
	if over := c.bytes + c.reserved - c.limit; over > 0 {
		err = fmt.Errorf("trim chunk cache: %d bytes over its limit of %d, all pinned or being written: %w",
			over, c.limit, errdefs.ErrExhausted)
	}
	c.mu.Unlock()
	c.finish(victims)
	return err
}

// SetLimit changes the most bytes of chunks the cache holds and evicts down to it. A negative
// limit counts as 0. When pinned chunks exceed the new limit, they stay, and Puts fail with
// errdefs.ErrExhausted until they are unpinned.
func (c *Cache) SetLimit(maxBytes int64) {
	c.mu.Lock()
	c.limit = max(maxBytes, 0)
	c.mu.Unlock()
	if err := c.Trim(); err != nil && !errors.Is(err, errClosed) {
		c.log.Warn("chunk cache: limit lowered below what is pinned", "limit", maxBytes, "err", err)
	}
}

// Remove deletes a chunk, pinned or not. It fails with errdefs.ErrNotFound when the chunk is
// not stored. Pins stay: the chunk is pinned again when it is stored again.
func (c *Cache) Remove(digest [32]byte) error {
	c.mu.Lock()
	if err := c.beginLocked(); err != nil {
		c.mu.Unlock()
		return err
	}
	defer c.ops.Done()
	e := c.entries[digest]
	if e == nil {
		c.mu.Unlock()
		return fmt.Errorf("remove chunk: %w", notFound(digest))
	}
	r := c.removeLocked(e)
	c.mu.Unlock()
	c.finish([]removal{r})
	return nil
}

// evictLocked takes least recently used unpinned chunks out of the index until need more
// bytes fit under the limit, or none is left, and returns them for finish.
//
// Preconditions: c.mu is held.
func (c *Cache) evictLocked(need int64) []removal {
	var victims []removal
	var freed int64
	for c.bytes+c.reserved+need > c.limit {
		e := c.lru.back()
		if e == nil {
			break
		}
		victims = append(victims, c.removeLocked(e))
		freed += e.size
		c.stats.Evictions++
		c.stats.EvictedBytes += e.size
	}
	if len(victims) > 0 {
		c.log.Debug("chunk cache: evicted", "chunks", len(victims), "bytes", freed)
	}
	return victims
}

// write stores a verified chunk durably: temp file, fsync, rename, fsync of the directory. Its
// mtime is set to mtime, the time the index records.
func (c *Cache) write(d [32]byte, data []byte, mtime int64) (err error) {
	f, err := os.CreateTemp(c.tmpDir, "put-*")
	if err != nil {
		return classify(err)
	}
	tmp := f.Name()
	renamed := false
	defer func() {
		if !renamed {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return classify(err)
	}
	t := time.Unix(0, mtime)
	if err := os.Chtimes(tmp, t, t); err != nil {
		return classify(err)
	}
	if err := f.Sync(); err != nil {
		return classify(err)
	}
	if err := f.Close(); err != nil {
		return classify(err)
	}
	dst := c.path(d)
	if err := os.Rename(tmp, dst); errors.Is(err, fs.ErrNotExist) {
		// Someone deleted the chunk directory; make it again.
		if err := os.Mkdir(filepath.Dir(dst), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return classify(err)
		}
		if err := syncDir(c.chunksDir); err != nil {
			return classify(err)
		}
		if err := os.Rename(tmp, dst); err != nil {
			return classify(err)
		}
	} else if err != nil {
		return classify(err)
	}
	renamed = true
	if err := c.syncShard(d[0]); err != nil {
		// The file is whole and synced; only its name may not survive a crash, which costs a
		// refetch. Keep the chunk.
		c.log.Error("chunk cache: could not sync a chunk directory", "err", err)
	}
	return nil
}

// syncShard fsyncs the chunk directory of first byte b after a rename into it. Callers that
// arrive while an fsync runs wait for it and run one more together.
func (c *Cache) syncShard(b byte) error {
	s := &c.shards[b]
	ticket := s.renames.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.synced >= ticket {
		return nil // an fsync that started after our rename has finished
	}
	upto := s.renames.Load()
	if err := syncDir(filepath.Join(c.chunksDir, fmt.Sprintf("%02x", b))); err != nil {
		return err
	}
	s.synced = upto
	return nil
}

// classify adds errdefs.ErrExhausted to a full disk or quota.
func classify(err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("%w: %w", errdefs.ErrExhausted, err)
	}
	return err
}
