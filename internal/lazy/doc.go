//go:build linux

// Package lazy serves layer data on demand: lazyd, the node's layer data server.
//
// # Model
//
// An imported layer is stored as a small EROFS metadata image (the directory tree, inodes,
// sizes, xattrs) and a data blob holding every file's bytes, which the image names as its extra
// device (internal/erofs BuildSplit). The blob is cut into chunks of at most 1 MiB on file chunk
// boundaries, each named by its SHA-256 (a Table, written beside the image). A node mounts the
// metadata image from its own disk with the device being <Dir>/mnt/<name>.blob, a read-only file
// of a FUSE mount this package serves. The kernel's EROFS reads file data from that file, with
// direct I/O, only when a sandbox reads a page it does not have in its page cache; each READ is
// answered from the node's chunk cache (internal/chunkcache) or, for missing chunks, by a ranged
// read of the blob store. A read of cached data is one pread of a chunk file; repeated reads are
// served by EROFS's page cache and never reach this package.
//
// # Fetching
//
// A miss fetches the missing chunk and the missing chunks after it up to FetchWindow (default
// 2 MiB) in one ranged read. Concurrent misses of one chunk share one fetch (keyed by the chunk's
// digest, so two layers sharing content share the fetch too). Every chunk is checked against its
// SHA-256 before it is stored or served: a mismatch (corruption at rest in the blob store or in
// transit) is counted and the range fetched again. Failed reads are retried with backoff (100 ms
// doubling to 3 s) until ReadTimeout (default 30 s); a reader that joined a fetch which gave up
// starts another while its own time lasts; then it gets EIO, never wrong bytes and never an
// endless wait, and the mount stays usable for the next read. A reader that misses where its
// last range ended (or inside what was read ahead) is sequential: Readahead bytes (default
// 16 MiB) past it are kept in flight, and reaching the middle of that region extends it once. Cached chunks are
// verified on their first read after the cache is opened (chunkcache), and a corrupt one is
// refetched.
//
// A sandbox's fetch mode (Register) is one of:
//   - eager: every chunk of its layers is fetched, Parallel ranged reads of up to 4x FetchWindow
//     at once, before Register returns (the baseline); its chunks are pinned from then until
//     Unregister, and Register fails if the cache cannot hold them;
//   - lazy: nothing before the sandbox starts; chunks come as they are read;
//   - prefetch: lazy, and at once the chunks recorded as read in the first seconds of an earlier
//     sandbox of the same environment key are fetched in parallel, then, if the request sets a
//     fill rate for a layer, the rest of that layer in the background at no more than that
//     many bytes per second.
//
// Recording: for RecordSeconds after Register, every chunk a sandbox reads is noted in order of
// first read. A read is the sandbox's when the FUSE request's process is in a cgroup whose path
// holds the sandbox's ID; reads the kernel makes on its own (pid 0, readahead) count for every
// sandbox recording that layer. At the end of the window, or at Unregister, the chunks are merged
// into the profile of (key, layer), kept under <Dir>/profiles/ and shared in the blob store under
// profiles/, so that a node that never ran the environment prefetches what another node recorded.
//
// # Cache and pinning
//
// The chunk cache is bounded (CacheMax, default 10 GiB) with least-recently-used eviction. While
// any handle of a layer's blob file is open (an EROFS mount holds one for its whole life, which
// outlasts the mount's name for as long as an overlay uses it), all that layer's chunks are pinned
// and never evicted. When only pinned chunks remain, a fetched chunk is served without being
// stored (counted as bypassed).
//
// # Process and lifecycle
//
// Run serves one directory per node:
//
//	<Dir>/lazyd.lock   flock held by the serving process
//	<Dir>/lazyd.sock   control API (HTTP over a unix socket; Client)
//	<Dir>/lazyd.log    its log, when started by Start
//	<Dir>/mnt/         the FUSE mount: <name>.blob per layer with a table
//	<Dir>/tables/      <name>.json chunk tables, written by the layer store
//	<Dir>/cache/       the chunk cache
//	<Dir>/profiles/    <key hash>/<name>.json prefetch profiles
//	<Dir>/keeper.sock  the keeper of the FUSE connection (keeper.lock: held by it)
//	<Dir>/fuse-opens.json  the connection's open file handles, for the lazyd that resumes it
//
// corral up and corral edge start it (Start) as `corral lazyd` in a session of its own, so it
// outlives their restarts and crashes: EROFS mounts of surviving sandboxes read through it, and
// a FUSE server that died would fail their reads. Each holds it through a request kept open.
// It exits once no blob file is open and no client holds it: at once after Client.Close (unless
// a client holds it again), two seconds after the last client went otherwise, 15 s after start
// when no client ever came. Once it decided to exit it refuses holds and opens, so a starting
// client retries and starts a new lazyd (StartRetrying), and no mount lands on a dying server.
// A client whose hold ends (the server went) reports Dead and is replaced.
//
// # Crashes
//
// The FUSE protocol is spoken here (fuse.go) so that a lazyd can take over a connection another
// one served: node IDs are the first 8 bytes of layer names, file handles are the unique IDs of
// their OPEN requests, and open handles are kept in fuse-opens.json. With Config.KeeperCommand,
// Run hands a descriptor of the connection it mounts to a keeper process (RunKeeper, `corral
// lazyd-keeper`), which holds it, so the connection and its mounts outlive a lazyd that dies:
// reads wait in the kernel. The keeper starts lazyd again; the new one attaches, receives the
// descriptor, has the kernel resend what the dead one left unanswered (FUSE_NOTIFY_RESEND) and
// serves on. A lazyd whose keeper dies starts another. Only both dying together ends the
// connection: the next lazyd detaches the dead mount, and mounts that read through it fail with
// EIO until their sandboxes are recreated.
//
// # Statistics
//
// Per layer and per registered sandbox: bytes read by the kernel, cache hits and misses, bytes
// and ranged reads fetched, failures, corrupt chunks, EIO returned, a fetch latency histogram,
// prefetch chunks and how many of them were then read, background fill bytes, the last error.
//
// # Concurrency
//
// Server.mu guards the layer, in-flight and sandbox maps and per-layer open counts; it is never
// held across I/O. Counters are atomics. Fetches run on their own goroutines with their own
// deadlines, so a reader that gives up does not fail the others waiting on the same chunk.
// At most 4x Parallel ranged reads run at once.
package lazy
