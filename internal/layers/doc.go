//go:build linux

// Package layers owns Corral's layer store: immutable, content-addressed filesystem trees that
// sandboxes stack as read-only overlayfs lower layers. It imports tar archives (plain, gzip or
// zstd), names each tree by a digest of its canonical form, converts it once to an EROFS image,
// keeps image and record in a blob store (internal/blobstore: a directory or S3, possibly shared
// by several nodes), and mounts each image once per node for every sandbox that uses it. The
// name:version -> digest catalogue is not here; it lives in the store package, which decides
// when a blob is unreferenced.
//
// # Layout
//
// In the blob store:
//
//	layers/sha256/<hex>.json      the layer's record: digest, size, entries, its image's digest and size
//	images/sha256/<hex>.erofs     the EROFS image, named by the SHA-256 of its bytes
//
// The image is written before the record, so a record never names a missing image, and images are
// content-addressed, so two nodes importing the same layer at once never overwrite each other's
// record with one that names a different image.
//
// On the node, one directory (Config.Dir), mode 0700 because the layers hold setuid binaries and
// file capabilities that must not be reachable by host users:
//
//	<Dir>/lock               flock(2) held by the one Store that owns the directory
//	<Dir>/staging/           imports in progress (extracted tree, image, verify mount); emptied by Open
//	<Dir>/images/<hex>.erofs images fetched from a blob store with no local files (S3), checked on arrival
//	<Dir>/mnt/<hex>/         one read-only EROFS mount per layer in use, named by the layer digest
//
// A directory blob store's images are mounted where they lie, with no copy. EROFS mounts are
// file-backed where the kernel allows it (Linux 6.12+, image on a plain filesystem) and through a
// read-only loop device otherwise (internal/erofs).
//
// # Lifecycle
//
//   - Open validates the Config, creates the layout, takes the lock, deletes leftovers of a
//     crashed process from staging/, adopts the layer mounts a previous process left (sandboxes
//     outlive corral) and converts plain trees that an older Corral stored in <Dir>/sha256/.
//     A second Open of the same Dir fails with errdefs.ErrConflict.
//   - ImportTar extracts into a fresh directory under staging/ and computes the digest of the
//     tree. If the blob store has a record of that digest, the import is a no-op. Otherwise it
//     builds the EROFS image, mounts it and checks that the mounted tree has the same digest
//     (nothing lost in conversion), stores the image and then the record, and deletes the tree.
//   - Acquire mounts a layer (downloading its image first when needed) and returns the directory
//     for overlayfs; Release drops the reference, and the last one unmounts. After a restart the
//     caller re-takes the references of surviving sandboxes with Hold and unmounts the rest with
//     Sweep.
//   - Stat, List and Verify read records (Verify also re-hashes the image and the mounted tree).
//   - Remove deletes the record, then the image, then the node's cached copy; it refuses a layer
//     this node has mounted. CollectImages removes images no record names.
//   - Close unmounts the layers nobody holds and releases the lock. No method may be called
//     after Close.
//
// All methods are safe for concurrent use. Each import works in its own staging directory, and
// concurrent imports of the same content both succeed. Concurrent Acquires of one layer mount it
// once and share one download. ImportTar decompresses in the caller's goroutine.
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
// are user.* (except user.overlay.*), security.capability and trusted.overlay.opaque; an import
// keeps security.capability only with Config.SetID "keep" (as it keeps setuid bits), so by
// default no layer, and no snapshot, carries a file capability.
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
