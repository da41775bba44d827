//go:build linux

// Package blobstore owns Corral's blob store: a flat namespace of objects (EROFS layer images,
// small JSON records) behind the Store interface, with two backends, a local or shared directory
// and S3-compatible object storage. Open picks the backend from a spec string; nothing else in
// Corral constructs one. Several `corral up` processes, on one host or several, may open the same
// location at once: every operation is safe against the others, and the package keeps no state
// between calls beyond the S3 client's connection pool.
//
// # Keys
//
// A key is '/'-separated segments of [A-Za-z0-9._:-], at most 512 bytes in all and 255 in a
// segment, with no empty, "." or ".." segment and a first segment other than ".tmp" (CheckKey).
// Every method checks its key before any I/O. The same key names the same object on both
// backends, except that the directory backend cannot hold both "a" and "a/b" (see below).
//
// # Lifecycle
//
//   - Open parses the spec, creates or checks the location and returns a Store. There is no
//     Close: the directory backend holds no descriptors between calls, and the S3 client's idle
//     connections are dropped by its transport.
//   - Put writes an object; it is invisible until complete, then replaces any previous object at
//     once. Get, GetRange, Stat and List read committed objects only. Delete removes one.
//
// # Directory backend ("dir:/abs/path")
//
// Layout under the root, which Open creates with mode 0700 (the root user of the host only):
//
//	<root>/.tmp/put-<random>   objects being written; Open deletes those older than an hour
//	<root>/<key>               one regular file per object, 0644, in directories 0755
//
// Put writes the data to a new file in .tmp/, fsyncs it, creates the key's parent directories,
// renames the file into place and fsyncs the parent, so an object is visible whole or not at all
// and survives a crash once Put returns. Concurrent Puts of one key each rename their own file;
// the last rename wins and every Put succeeds. A failed or cancelled Put removes its temp file;
// a crashed process leaves one behind, which the next Open on any host deletes after an hour.
// Readers keep reading the object they opened when it is replaced or deleted. The root and .tmp
// must be on one filesystem (rename does not cross filesystems) and that filesystem must make
// rename atomic to every client, as local filesystems and NFS do.
//
// Every path below the root is resolved with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), one
// directory at a time when creating, so no operation follows a symlink: a path through one fails
// with errdefs.ErrDenied. List walks only the directory its prefix names and skips symlinks,
// special files and names that are not key segments. Because an object is a file, a key cannot
// both be an object and continue below it: Put of "a/b" while "a" exists (or of "a" while "a/b"
// exists) fails with errdefs.ErrConflict. Delete leaves empty directories behind, since removing
// them would race with a concurrent Put into them. A full disk fails with errdefs.ErrExhausted.
//
// # S3 backend ("s3://bucket[/prefix]?endpoint=...")
//
// Objects are stored under "<prefix>/<key>" in an existing bucket, addressed path-style, with
// minio-go. Put streams: up to 16 MiB of known size is one PUT, anything larger or of unknown
// size a multipart upload in 16 MiB parts, holding one part in memory. S3 makes an object visible
// only when its PUT or CompleteMultipartUpload succeeds, so readers never see part of one, and
// concurrent writers of one key all succeed with the last one winning. Put stops feeding the
// request once ctx is done, so a Put cancelled before its reader ran dry commits nothing. A Put
// that fails after the server had every byte (the response was lost, or ctx ended at that very
// moment) may or may not have committed, and S3 offers no way to tell: the caller puts again,
// which is harmless for content-addressed keys. A failed multipart upload is aborted by
// minio-go; one left by a crashed process is invisible and is reclaimed by the bucket's
// lifecycle rule for incomplete uploads, which the operator should set. minio-go retries failed
// requests by itself; the caller's ctx bounds each operation, and a Get's ctx bounds the whole
// read. Errors: a missing key wraps errdefs.ErrNotFound, refused credentials errdefs.ErrDenied,
// a missing bucket (at Open) errdefs.ErrNotFound, server errors and unreachable endpoints
// errdefs.ErrUnavailable.
package blobstore
