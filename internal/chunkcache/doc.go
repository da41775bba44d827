//go:build linux

// Package chunkcache owns a node's on-disk cache of layer data chunks for lazy image loading:
// content-addressed units of at most MaxChunkSize bytes, named by the sha256 of their bytes,
// that the node fetched from the blob store. The FUSE daemon (package lazy) reads chunks from
// it, Puts what it fetched on a miss, and Pins the chunks of mounted layers. The cache knows
// nothing of layers, blobs or the blob store; it stores, verifies, pins and evicts chunks.
//
// # Layout
//
// A Cache owns one directory, which Open creates with mode 0700:
//
//	<dir>/lock                  flock(LOCK_EX) held by the one Cache open on dir
//	<dir>/tmp/put-<random>      chunks being written; Open deletes whatever it finds here
//	<dir>/sha256/<ab>/<abcd…>   one immutable file (0600) per chunk, named by its 64 lowercase
//	                            hex digits, in one of 256 directories named by the first two
//
// There is no index file: the directory is the index. Open lists it (256 directories in
// parallel), takes each chunk's size from the file and its last access time from the file's
// mtime, and deletes, with a log line, every entry that cannot be a chunk: a bad name, a name
// in the wrong directory, something other than a regular file, or a size of 0 or above
// MaxChunkSize (a zero-length file is what some filesystems leave of a file renamed just before
// a crash). Other files in <dir> are left alone.
//
// # Lifecycle
//
//   - Open locks the directory (a second Open of it, in this process or another, fails with
//     errdefs.ErrConflict), cleans it and loads the index. It does not evict, even when the
//     directory holds more than maxBytes: pins do not survive a restart, so the caller should
//     Pin the chunks of the layers still mounted first; the next Put, Trim or SetLimit evicts.
//   - Put stores a chunk, ReadAt reads one, Has and Size look one up; Remove deletes one.
//     PutVerified is Put for a caller that has checked the digest itself (no second hash).
//   - Pin(owner, digests) adds digests to the set an owner (a layer's data digest, say) pins;
//     Unpin(owner) drops the whole set. A chunk pinned by at least one owner is never evicted.
//     Digests not yet stored may be pinned; they are pinned once Put. Pin sorts its digests
//     outside the lock, and both update at most 1024 digests per hold of it (well under a
//     millisecond), so a layer of 100,000 chunks (some 40 ms of work) never stalls reads.
//   - SetLimit changes maxBytes and evicts down to it; Trim evicts down to the current limit.
//   - Close waits for the Puts and ReadAts in progress, writes the access times still held only
//     in memory to the files' mtimes, closes every file and releases the lock. Put, ReadAt,
//     Trim and Remove then fail with errdefs.ErrUnavailable, and Has and Size report false.
//
// # Guarantees
//
// Put verifies that the data hashes to the digest before anything touches the disk, writes a
// temp file, fsyncs it, renames it into place and fsyncs the chunk's directory (concurrent Puts
// into one directory share one fsync), so a chunk is visible whole or not at all, and present
// after a crash once Put has returned. Concurrent Puts of one digest write it once; a Put of a
// stored chunk only counts as an access.
//
// Chunks are immutable, but the disk under them is not trusted across restarts: the first
// ReadAt of each chunk after Open hashes the whole file. A chunk that does not match, or whose
// read fails with EIO, EBADMSG or EUCLEAN (a bad sector, a checksum error), is deleted, counted
// in Stats.CorruptDetected, logged, and reported as errdefs.ErrNotFound, so the caller fetches
// it again. Chunks written by Put in this process are not hashed again. Has and Size never read
// the file, so they can report a chunk that the first ReadAt then finds corrupt.
//
// # Eviction
//
// The cache keeps the total size of its chunks at or below maxBytes, evicting the least
// recently used unpinned chunks first. Put evicts synchronously before it writes, so eviction
// is bounded by the chunks one Put displaces. A chunk's last use is its latest ReadAt, its
// Put, or the moment its last pin went (a pinned chunk was in use the whole time). Access times
// live in memory and reach the file's mtime at most once a minute per chunk, and at Close, so
// after a restart the order is the one of a minute before it, or exact after a clean Close.
//
// If a chunk cannot fit because everything else is pinned (or being written), Put stores
// nothing, evicts nothing, counts it in Stats.Bypassed and fails with errdefs.ErrExhausted:
// the caller serves the bytes from memory without caching them. A full disk (ENOSPC, EDQUOT)
// fails the same way. Eviction removes a chunk from the index before its file is deleted, so
// the disk can briefly hold the evicted bytes of Puts in progress beside maxBytes; deletions
// are not fsynced, and a chunk that comes back after a crash is simply found again by Open.
//
// # Failure semantics
//
// Errors wrap an errdefs kind: ErrNotFound for a chunk that is missing, was just found corrupt,
// or was evicted while ReadAt opened it; ErrInvalid for data that does not match its digest, is
// empty or larger than MaxChunkSize, or a negative offset; ErrExhausted as above; ErrConflict
// for a directory another Cache holds; ErrUnavailable after Close. ReadAt otherwise follows
// io.ReaderAt: a read past the end returns the bytes up to it and io.EOF. A chunk file deleted
// by hand is dropped from the index at its next ReadAt. A failure to delete a file during
// eviction is logged; the chunk leaves the index anyway and Open finds it again after a restart.
//
// # Concurrency
//
// All methods are safe for concurrent use. One mutex, mu, guards the index, the pin counts,
// the open files and the counters; nobody holds it across disk I/O: reads, hashing, writes,
// fsyncs, renames, unlinks and opens happen outside it. Pin and Unpin are serialized by pinMu,
// which guards the owners' sets and is taken before mu, never while holding it. A digest being written or deleted is marked
// busy in the index with a channel, and a Put of that digest waits on it. ReadAt takes a
// reference on the chunk's open file; a chunk evicted during a read is read to the end through
// that file, which is closed when the last reader lets go. Up to 256 files stay open between
// reads (the least recently used is closed first), so a read costs a pread, not an open too.
// The per-directory fsync groups have their own mutexes, never taken while holding mu. No
// method starts a goroutine that outlives it.
package chunkcache
