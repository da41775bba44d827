//go:build linux

package chunkcache

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// errStale says that the chunk ReadAt looked up left the index while its file was opened.
var errStale = errors.New("chunk changed while it was opened")

// staleRetries is how often ReadAt looks a chunk up again after errStale.
const staleRetries = 3

// ReadAt reads len(p) bytes of a stored chunk from offset off, like io.ReaderAt: fewer bytes
// come with io.EOF at the chunk's end. It counts as an access. It fails with
// errdefs.ErrNotFound when the chunk is not stored or turns out corrupt (it is then deleted).
func (c *Cache) ReadAt(digest [32]byte, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read chunk sha256:%s: negative offset %d: %w", hexDigest(digest), off, errdefs.ErrInvalid)
	}
	c.mu.Lock()
	if err := c.beginLocked(); err != nil {
		c.mu.Unlock()
		return 0, err
	}
	c.mu.Unlock()
	defer c.ops.Done()
	for try := 0; ; try++ {
		h, err := c.acquire(digest)
		if errors.Is(err, errStale) {
			if try < staleRetries {
				continue
			}
			return 0, notFound(digest)
		}
		if err != nil {
			return 0, err
		}
		return c.read(h, p, off)
	}
}

// handle is a reader's reference on a chunk's open file.
type handle struct {
	e       *entry
	f       *os.File
	persist int64 // when non-zero, the access time to write to the file's mtime after reading
}

// read reads from a held chunk, verifying it first if this process has not, and lets it go.
func (c *Cache) read(h handle, p []byte, off int64) (int, error) {
	defer c.release(h.e)
	if err := c.verify(h); err != nil {
		return 0, err
	}
	n, err := h.f.ReadAt(p, off)
	if err != nil && err != io.EOF {
		if mediaError(err) {
			c.corrupt(h.e, "read failed", err)
			return 0, notFound(h.e.digest)
		}
		return n, fmt.Errorf("read chunk sha256:%s: %w", hexDigest(h.e.digest), err)
	}
	if h.persist != 0 {
		t := time.Unix(0, h.persist)
		if err := os.Chtimes(c.path(h.e.digest), t, t); err != nil && !errors.Is(err, fs.ErrNotExist) {
			c.log.Debug("chunk cache: could not save an access time", "digest", hexDigest(h.e.digest), "err", err)
		}
	}
	return n, err
}

// acquire looks a chunk up, counts an access and returns it held, its file open.
func (c *Cache) acquire(d [32]byte) (handle, error) {
	now := c.now().UnixNano()
	c.mu.Lock()
	e := c.entries[d]
	if e == nil {
		c.mu.Unlock()
		return handle{}, notFound(d)
	}
	if e.file != nil {
		h := c.holdLocked(e, now)
		c.mu.Unlock()
		return h, nil
	}
	c.mu.Unlock()

	f, err := openChunk(c.path(d))

	c.mu.Lock()
	if c.entries[d] != e {
		// Evicted or removed, and maybe stored again, while we opened it: f may be either.
		c.mu.Unlock()
		if f != nil {
			f.Close()
		}
		return handle{}, errStale
	}
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			c.mu.Unlock()
			return handle{}, fmt.Errorf("read chunk sha256:%s: %w", hexDigest(d), err)
		}
		r := c.removeLocked(e)
		c.mu.Unlock()
		c.log.Warn("chunk cache: a chunk file was deleted behind the cache's back; dropping it from the index",
			"path", c.path(d))
		c.finish([]removal{r})
		return handle{}, notFound(d)
	}
	var extra []*os.File
	if e.file == nil {
		e.file = f
		c.openFiles++
	} else {
		extra = append(extra, f) // another reader opened it first
	}
	h := c.holdLocked(e, now)
	extra = c.trimFilesLocked(extra)
	c.mu.Unlock()
	for _, f := range extra {
		f.Close()
	}
	return h, nil
}

// holdLocked takes a reader's reference on e's open file and counts an access at now.
//
// Preconditions: c.mu is held; e is in the index and e.file is open.
func (c *Cache) holdLocked(e *entry, now int64) handle {
	if c.idle.contains(e) {
		c.idle.remove(e)
	}
	e.readers++
	c.touchLocked(e, now)
	h := handle{e: e, f: e.file}
	if now-e.mtime >= int64(persistInterval) {
		e.mtime = now
		h.persist = now
	}
	return h
}

// release drops a reader's reference; the last reader of a removed chunk closes its file.
func (c *Cache) release(e *entry) {
	var closing []*os.File
	c.mu.Lock()
	e.readers--
	if e.readers == 0 {
		if e.removed {
			closing = append(closing, e.file)
			c.dropFileLocked(e)
		} else {
			c.idle.pushFront(e)
		}
	}
	closing = c.trimFilesLocked(closing)
	c.mu.Unlock()
	for _, f := range closing {
		f.Close()
	}
}

// trimFilesLocked forgets the least recently used idle files beyond the bound and appends them
// to closing, for the caller to close once it lets go of c.mu.
//
// Preconditions: c.mu is held.
func (c *Cache) trimFilesLocked(closing []*os.File) []*os.File {
	for c.openFiles > c.maxOpen {
		e := c.idle.back()
		if e == nil {
			break // the rest are being read; release closes them
		}
		closing = append(closing, e.file)
		c.dropFileLocked(e)
	}
	return closing
}

// verify hashes a held chunk the first time this process reads it. Concurrent readers wait for
// one hash. A corrupt chunk is deleted and reported as not found.
func (c *Cache) verify(h handle) error {
	e := h.e
	for {
		c.mu.Lock()
		if e.verified {
			c.mu.Unlock()
			return nil
		}
		if e.removed {
			// Evicted or found corrupt by another reader before anyone vouched for it.
			c.mu.Unlock()
			return notFound(e.digest)
		}
		if ch := e.verifying; ch != nil {
			c.mu.Unlock()
			<-ch
			continue
		}
		done := make(chan struct{})
		e.verifying = done
		c.mu.Unlock()

		sum, n, err := hashFile(h.f, e.size)

		good := err == nil && n == e.size && sum == e.digest
		var why string
		switch {
		case good, err != nil && !mediaError(err):
		case err != nil:
			why = "read failed"
		case n != e.size:
			why = fmt.Sprintf("size changed from %d to %d", e.size, n)
		default:
			why = "content hashes to sha256:" + hexDigest(sum)
		}
		c.mu.Lock()
		e.verifying = nil
		e.verified = good
		var rs []removal
		if why != "" {
			// Removed before the waiters wake: none of them hashes it again or counts it twice.
			rs = c.corruptLocked(e)
		}
		close(done)
		c.mu.Unlock()
		switch {
		case good:
			return nil
		case why == "":
			return fmt.Errorf("verify chunk sha256:%s: %w", hexDigest(e.digest), err)
		}
		c.logCorrupt(e, why, err, rs)
		return notFound(e.digest)
	}
}

// corrupt counts, logs and deletes a chunk whose file does not hold its bytes.
func (c *Cache) corrupt(e *entry, why string, err error) {
	c.mu.Lock()
	rs := c.corruptLocked(e)
	c.mu.Unlock()
	c.logCorrupt(e, why, err, rs)
}

// corruptLocked counts a corrupt chunk and removes it from the index; finish the removals (and
// log) once c.mu is let go.
//
// Preconditions: c.mu is held.
func (c *Cache) corruptLocked(e *entry) []removal {
	c.stats.CorruptDetected++
	if e.removed {
		return nil
	}
	return []removal{c.removeLocked(e)}
}

// logCorrupt logs a corrupt chunk and finishes its removal.
func (c *Cache) logCorrupt(e *entry, why string, err error, rs []removal) {
	args := []any{"path", c.path(e.digest), "why", why}
	if err != nil {
		args = append(args, "err", err)
	}
	c.log.Error("chunk cache: deleted a corrupt chunk; it will be fetched again", args...)
	c.finish(rs)
}

// hashFile returns the sha256 of f's first size bytes and how many bytes it has, up to size+1.
func hashFile(f *os.File, size int64) (sum [32]byte, n int64, err error) {
	hash := sha256.New()
	n, err = io.Copy(hash, io.NewSectionReader(f, 0, size+1))
	if err != nil {
		return sum, n, err
	}
	copy(sum[:], hash.Sum(nil))
	return sum, n, nil
}

// mediaError reports whether a read failed because the disk lost the data: EIO, or a checksum
// or structure error from the filesystem (EBADMSG is ext4's EFSBADCRC, EUCLEAN its
// EFSCORRUPTED).
func mediaError(err error) bool {
	return errors.Is(err, unix.EIO) || errors.Is(err, unix.EBADMSG) || errors.Is(err, unix.EUCLEAN)
}

// openChunk opens a chunk file for reading, without updating its atime where the kernel lets
// us (the cache keeps its own access times in the mtime).
func openChunk(path string) (*os.File, error) {
	flags := unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOATIME
	for {
		fd, err := unix.Open(path, flags, 0)
		switch {
		case err == nil:
			return os.NewFile(uintptr(fd), path), nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EPERM) && flags&unix.O_NOATIME != 0:
			flags &^= unix.O_NOATIME // not the file's owner
			continue
		}
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
}
