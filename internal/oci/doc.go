// Package oci reads container images from where users keep them (a registry, an OCI image
// layout directory, a `docker save` archive) and turns them into uncompressed tar streams that the
// layer store imports (layers.Store.ImportTar), plus the parts of the image config a sandbox
// needs. It owns no state on disk: it spools fetched layer blobs in a temporary directory for the
// length of one call.
//
// # Lifecycle
//
//   - Open resolves the source (the tag, the platform's manifest in an index), fetches the
//     manifest and the config, checks that they describe a Linux container image and returns a
//     Reader. It reads no layer bytes.
//   - Image describes the image: manifest digest, config, layer count and size.
//   - Flatten writes the image's whole root filesystem as one tar; Groups and WriteGroup write
//     it as a few tars, one per group of consecutive layers, for a store that shares layers
//     between images. Each call reads the layers it needs from the source again; for a registry
//     it first downloads them into Options.TempDir, so that a transfer that breaks can be retried
//     before a byte reaches the caller's writer.
//
// A Reader holds no open files and needs no Close. Its methods are safe for concurrent use; each
// call works in its own temporary directory and starts no goroutine that outlives it.
//
// # Merging layers
//
// Flatten and WriteGroup read each layer they write twice. The first pass reads only the tar
// headers and builds the merged tree in memory: later layers replace earlier entries, ".wh.NAME"
// deletes NAME from the layers below, ".wh..wh..opq" empties a directory of what the layers below
// put there, a hardlink shares the inode of its target as it was when the link was made. The
// second pass writes the result: first every directory, symlink, device, fifo and (WriteGroup
// only) whiteout in depth-first order, then the regular files in the order their content appears
// in the layers, each inode once with its other names as hardlinks to the first. So a hardlink
// whose target a later layer replaced or deleted keeps the old content. (go-containerregistry's
// mutate.Extract, which walks the layers top-down, links it to the new file or to nothing, and
// drops symlinks whose relative target climbs above the root; hence this package's own merge.)
// The first pass holds a few hundred bytes per entry; more than two million entries fail with
// errdefs.ErrTooLarge.
//
// WriteGroup keeps a whiteout only where it hides something below the group: overlayfs shows a
// whiteout in a directory that no lower layer has as a name that cannot be opened. A whiteout of
// a path no earlier layer of the group touched is kept as the image builder wrote it (builders
// write whiteouts only for paths the lower layers have). One of a path the group itself created
// is kept only if the layers below the group have the path, which WriteGroup finds out by reading
// their headers from the top down until every such path is decided.
//
// # Failure semantics
//
// Errors name the source and the cause and wrap an errdefs kind: a reference, tag, manifest or
// blob that does not exist wraps ErrNotFound; a registry that wants credentials ErrUnauthorized,
// one that refuses them ErrDenied; something that is not a Linux container image for the
// platform (a Helm chart, a Windows image, schema 1, an unknown media type), a malformed
// manifest, config or layer, and content that does not match its digest wrap ErrInvalid; a
// registry that fails (5xx), times out or cannot be reached, after Options.Retries retries, wraps
// ErrUnavailable. A cancelled context is returned as is. When Flatten or WriteGroup fails, what
// it wrote so far is incomplete: the caller must discard it (close the pipe into ImportTar with
// the error). Content is checked against the layer digest and the config's diff_id while it
// streams, so a mismatch can surface only after the last byte.
package oci
