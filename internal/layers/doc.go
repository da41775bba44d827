//go:build linux

// Package layers owns Corral's layer blob store: immutable, content-addressed filesystem trees
// that sandboxes stack as read-only overlayfs lower directories. It imports tar archives (plain,
// gzip or zstd) into trees, names each tree by a digest of its canonical form, and hands out the
// directory to mount. The name:version -> digest catalogue is not here; it lives in the store
// package, which decides when a blob is unreferenced.
//
// # Layout
//
// A Store owns one directory (Config.Dir), mode 0700 because the trees may hold setuid binaries
// and file capabilities that must not be reachable by host users:
//
//	<Dir>/lock                    flock(2) held by the one Store that owns the directory
//	<Dir>/staging/                imports and removals in progress; emptied by Open
//	<Dir>/sha256/<hex>/fs/        the tree: the overlay lowerdir that Path returns
//	<Dir>/sha256/<hex>/blob.json  size and entry count, written before the blob is committed
//
// The blob directory (not only the tree) is the unit of commit so that an EROFS image, an OCI
// descriptor or a chunk index can later sit beside fs/ without a new layout.
//
// # Lifecycle
//
//   - Open validates the Config, creates the layout, takes the lock and deletes leftovers of a
//     crashed process from staging/. A second Open of the same Dir fails with errdefs.ErrConflict.
//   - ImportTar extracts into a fresh directory under staging/, computes the digest of the tree,
//     syncs the filesystem (unless Config.NoSync) and renames the blob directory into sha256/ with
//     RENAME_NOREPLACE. If the digest is already stored, the new copy is deleted and the existing
//     blob is returned; importing the same content twice is a no-op.
//   - Path, Stat, List and Verify read committed blobs. Nobody writes to a committed tree.
//   - Remove renames the blob into staging/ and deletes it there, so a half-deleted blob is never
//     visible under sha256/. The caller must make sure no sandbox mounts the blob any more.
//   - Close releases the lock. No method may be called after Close.
//
// All methods are safe for concurrent use. The store needs no mutex: each import works in its
// own staging directory and commits with one rename, and concurrent imports of the same content
// both succeed, one of them as the no-op. No method starts a goroutine: ImportTar decompresses in
// the caller's.
//
// # Failure semantics
//
// An import either commits a complete, digest-checked blob or leaves nothing behind: on any error,
// including context cancellation midway, its staging directory is removed before ImportTar
// returns. Archives the store refuses (unsafe paths, devices, limits, malformed data) fail with
// errors that wrap errdefs.ErrInvalid or errdefs.ErrTooLarge and name the entry and the reason;
// a full disk wraps errdefs.ErrExhausted; unknown digests wrap errdefs.ErrNotFound.
//
// # Canonical form and digest
//
// A blob's digest is "sha256:" followed by the hex SHA-256 of the tree's canonical form. The form
// starts with the line "corral.layer.v1\n", then lists every entry of the tree, the root first, in
// depth-first pre-order with the names in each directory sorted bytewise. Each entry is a list of
// fields, each written as "<key> <decimal byte length> <value>\n", closed by an empty line "\n":
//
//	path    slash-separated path relative to the root; "." for the root
//	type    dir, reg, symlink, hardlink, char, block, fifo or whiteout
//	mode    permission, setuid, setgid and sticky bits, 4 octal digits (not for whiteout)
//	uid     numeric owner (not for whiteout)
//	gid     numeric group (not for whiteout)
//	target  hardlink: path of the first entry (in the order above) of the same inode; the
//	        entry has no other fields. symlink: the link text, stored as is
//	size    reg: content length in bytes
//	sha256  reg: hex SHA-256 of the content
//	rdev    char, block: "major:minor"
//	xattr   one field per preserved extended attribute, sorted by name, value "<name>\x00<bytes>"
//
// A whiteout (a 0:0 character device, overlayfs's mark for a deleted lower entry) carries only
// path and type: its mode and owner mean nothing to overlayfs. The preserved extended attributes
// are user.* (except user.overlay.*), security.capability and trusted.overlay.opaque.
// Modification, access and change times are NOT part of the digest: the same files with the same
// ownership and modes are one layer, however and whenever they were built. A blob keeps the mtimes
// of its first import; later imports of the same digest do not change them.
//
// Consequences: re-importing an archive, or a WriteTar of an imported tree, gives the same digest,
// and so do archives that differ only in entry order, timestamps or user/group names. A parent
// directory the archive does not list is created 0755 and owned by the importing user (root in
// production), the same as a listed directory with that mode and owner.
//
// # What an import accepts
//
// See ImportTar for the rules on paths, links, devices, duplicates, whiteouts and limits.
package layers
