//go:build linux

// Package erofs turns Corral layer trees into EROFS images and mounts them read-only, shared and
// reference-counted, as overlayfs lower layers for sandboxes.
//
// # Format
//
// Build runs erofs-utils' mkfs.erofs (1.5 or later) on the tree. Images are uncompressed: the
// kernel then reads file data in place, with no decompression on the sandbox's hot path and no
// per-page CPU cost; layers are compressed in transit and at rest in the blob store, not here.
// Everything overlayfs and the sandbox need survives: numeric owners, mode bits including setuid,
// setgid and sticky, nanosecond mtimes, hardlinks, symlinks, fifos, sockets, device nodes (so the
// 0:0 character devices overlayfs uses as whiteouts) and trusted.*, security.* and user.* xattrs
// (so trusted.overlay.opaque and file capabilities). Build is reproducible: the same tree gives
// the same bytes (see Build for the one caveat of erofs-utils before 1.9.3), and the filesystem
// UUID is derived from them. It must not be a constant: an overlay with index=on (or nfs_export)
// whose lower layers share a UUID logs "conflicting uuid detected" and falls back to xino=off and
// index=off (seen on 6.18). A split image's UUID is derived from its data blob too: two layers whose
// files differ only in content can have identical metadata.
//
// # Split images
//
// BuildSplit writes a layer as two files for lazy loading: a small metadata image (every inode,
// directory, xattr and symlink, and a chunk index per regular file) and a data blob holding the
// file data, which the image names as its one extra device (mkfs.erofs --chunksize --blobdev).
// A node keeps the image locally and can serve the blob on demand, for instance as a file on
// FUSE. In the blob, each file's data is cut into chunks of the chosen size (a power of two, 4 KiB
// to 1 GiB) counted from the file's start, and each chunk is stored at a 4 KiB-aligned offset,
// the gap after it filled with zeros; identical chunks are stored once and chunks of zeros not at
// all (they read as holes). A tree with no file data gives an empty blob, which the image still
// records as an extra device of zero blocks.
//
// Chunks cuts a blob into content-addressed units (offset, length, SHA-256): one per full chunk,
// and the small rest (file tails, small files) merged up to the chunk size. A full chunk of a file
// is a unit wherever the file lies in the blob, so layers that share files share those units,
// which lets a node cache units by digest across layers and versions.
//
// Known limits of mkfs.erofs that Build reports as such: erofs-utils before 1.8.5 cannot store
// 255-byte names; every release needs the path of each entry, relative to the tree, to stay under
// PATH_MAX (4094 bytes).
//
// # Mounting
//
// Mount tries a file-backed mount first: Linux 6.12+ with CONFIG_EROFS_FS_BACKED_BY_FILE reads the
// image file itself, with no block device, and with the "directio" option (where the kernel has
// it) without caching each block a second time as a page of the image file. The kernel refuses
// it with ENOTBLK when it lacks the feature, when the image's filesystem has no read_folio
// (tmpfs), and when the image lies on a stacked filesystem (overlayfs, or FUSE with passthrough;
// commit 072a7c7cdbea, "file-backed mounts cannot be applied to stacked fses", which keeps an
// overlay on top of the EROFS within the kernel's stack depth). Keep images on ext4 or xfs. On
// refusal Mount attaches the image to a free loop device (LOOP_CTL_GET_FREE, then LOOP_CONFIGURE
// read-only with autoclear and, where possible, direct I/O; retried when another process takes the
// device first) and mounts that. Autoclear ties the device's life to the filesystem: it is
// detached when the last mount of it goes, or at once if the mount fails, so Unmount needs no loop
// bookkeeping.
//
// An image with extra devices (a split image) is mounted with their files in
// MountOptions.Devices: file-backed, they are passed to the kernel as files ("device=" once per
// device); the kernel's stacking check covers the image only, so a device file may lie on FUSE,
// even with passthrough. The loop fallback puts the image and every device on loop devices of
// their own: the kernel refuses (EINVAL) an image file with block devices as extra devices, and
// the reverse. Mount checks the device count and sizes against the image first: the kernel's
// EINVAL for a wrong count says nothing, and an image mounted without its devices fails only
// later, with EIO on every read of file data.
//
// Mounts are read-only, nosuid, nodev and noexec. overlayfs checks only its own mount's flags, so
// sandboxes still run setuid binaries and use device nodes from the image (the stacking test checks
// both), while nothing under the mount directory itself can be used that way.
//
// # Shared mounts
//
// A Mounts owns one directory (mode 0700) and mounts each image once, at <dir>/<name>, where name
// is the layer's 64-hex-digit digest, however many sandboxes use it:
//
//   - OpenMounts creates the directory, adopts the EROFS mounts a previous process left there
//     (read from /proc/self/mountinfo) with zero references, and removes empty mount points of
//     mounts that did not survive. Adopted mounts are not remounted, so sandboxes that survived
//     the restart keep their lower layers.
//   - Acquire takes a reference, mounting on first use. Concurrent Acquires of one name mount once.
//     AcquireDevices does the same for a split image and its blob.
//   - Hold takes a reference on a name that is already mounted: the daemon calls it for each
//     sandbox it re-attaches after a restart.
//   - Release drops a reference; the last one unmounts and removes the mount point.
//   - Sweep unmounts every name with no references: after a restart, once every surviving sandbox
//     has been held, it removes the images nobody uses any more.
//
// # Failure semantics
//
// Build either renames a complete, synced image into place or leaves nothing at dst or beside it,
// including when ctx ends midway (mkfs.erofs is killed). BuildSplit does the same for both of its
// files, renaming the blob first so that an image never names a missing blob. A missing
// mkfs.erofs, or one too old for the tree, wraps errdefs.ErrUnavailable with what to install.
// Chunks refuses an image and blob that do not fit each other with errdefs.ErrInvalid.
//
// Mount errors name the image, the target and each attempt's cause, including the kernel's own
// message for a refused file-backed mount when it gives one. A failed Mount leaves no mount and
// no loop device, for the image or any extra device.
// Unmount never detaches lazily: a mount still in use after a short grace period (an open file or
// a cwd under it) fails with an error wrapping EBUSY and errdefs.ErrConflict, and stays mounted.
// When Release's unmount fails that way, the name stays mounted with zero references for Sweep or
// a later Acquire; the error is returned. An overlay does not make its layers busy: overlayfs
// holds private clones of their mounts, so unmounting an image a sandbox still uses succeeds and
// the filesystem (with its loop device) lives on, unreachable by name, until that overlay goes.
// The references in Mounts, not EBUSY, are what keep an image mounted while sandboxes use it.
//
// # Concurrency
//
// Mounts has one mutex, mu, guarding its map of names. Nobody holds it across a mount or unmount:
// the name is marked busy with a channel, other callers for that name wait on the channel, and
// callers for other names proceed. No method starts a goroutine. Build and Mount are safe to call
// concurrently; they share no state.
package erofs
