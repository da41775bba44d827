//go:build linux

package layers

import (
	"path/filepath"
	"time"

	"github.com/corral-dev/corral/internal/blobstore"
	"github.com/corral-dev/corral/internal/chunkcache"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lazy"
)

// Defaults for the zero values of Config.
const (
	DefaultMaxBytes   int64 = 16 << 30 // 16 GiB of file content per layer
	DefaultMaxEntries int64 = 1_000_000
	DefaultMaxRatio   int64 = 200
	DefaultRatioFloor int64 = 64 << 20 // 64 MiB

	SetIDStrip = "strip"
	SetIDKeep  = "keep"
)

// Config configures a Store. The zero value of every field but Dir means its default.
type Config struct {
	// Dir is the store's directory, usually <data-dir>/layers. It must be absolute. Open creates
	// it with mode 0700.
	Dir string

	// MaxBytes caps the file content of one layer, in bytes (duplicates of an entry count each
	// time). Hardlinks add nothing. Default DefaultMaxBytes.
	MaxBytes int64

	// MaxEntries caps the number of archive entries of one layer. Default DefaultMaxEntries.
	MaxEntries int64

	// MaxRatio caps expanded/input size: the bytes an import writes (file content plus 512 bytes
	// per entry) over the bytes it read from the caller. It stops compression bombs and sparse-file
	// bombs. It is only enforced once more than RatioFloor bytes are expanded, so small, highly
	// compressible layers pass. Default DefaultMaxRatio.
	MaxRatio int64

	// RatioFloor is the expanded size below which MaxRatio is not enforced. Default
	// DefaultRatioFloor.
	RatioFloor int64

	// AllowDevices accepts character and block device entries. Off by default: a layer has no
	// business shipping /dev/sda. The 0:0 character device, overlayfs's whiteout, is always
	// accepted.
	AllowDevices bool

	// SetID says what to do with the setuid and setgid bits of non-directories: SetIDStrip (the
	// default) clears them, SetIDKeep keeps them. The setgid bit of a directory (group
	// inheritance, not a privilege) is always kept. File capabilities (security.capability),
	// privilege as setuid is, go with them: dropped under SetIDStrip, kept under SetIDKeep.
	// Other security.* and trusted.* attributes are always dropped (trusted.overlay.* refused).
	SetID string

	// Blobs is the blob store of record for layer images and their records: a directory
	// (mounted in place) or S3 (downloaded into <Dir>/images on first use). Several nodes may
	// share one. Required.
	Blobs blobstore.Store

	// Linger is how long a layer no sandbox uses any more stays mounted, its page cache warm for
	// the next sandbox that uses it (a sandbox's first commands then read no image data again,
	// nor fetch it through lazyd); 0 unmounts it with its last sandbox. Layers are unmounted
	// when removed, and at Close, whatever this says.
	Linger time.Duration

	// Instance names this Corral in the records it writes (store.Instance), so that other
	// Corrals sharing the blob store can tell its fresh imports from orphans.
	Instance string

	// Lazy configures how layer data reaches the node (see the package doc, "Data on demand").
	Lazy LazyConfig
}

// LazyConfig configures the fetching of layer data: imports are stored as a metadata image and
// a data blob, which nodes fetch in chunks through lazyd (internal/lazy) into their chunk cache.
type LazyConfig struct {
	// Command starts the node's lazyd: the corral binary's `lazyd` subcommand with its flags.
	// It runs in a session of its own so that it outlives this process and keeps serving the
	// layers of sandboxes that survive a restart. Nil serves lazyd inside this process instead
	// (tests; its mounts then end with the process).
	Command []string
	// CacheMax bounds the chunk cache (default 10 GiB); used when lazyd runs in this process.
	CacheMax int64
	// ReadTimeout bounds a read waiting on the blob store before it fails with EIO (default
	// 30 s); used when lazyd runs in this process.
	ReadTimeout time.Duration
	// ChunkSize is the largest chunk an import cuts (default 1 MiB, a power of two >= 4 KiB).
	ChunkSize int64
	// Mode is the default fetch mode of sandboxes whose create names none: lazy.ModeEager,
	// lazy.ModeLazy or lazy.ModePrefetch (the default).
	Mode string
	// FillRate is the default background fill, in bytes per second, of a prefetch sandbox's
	// layers after their profiled chunks (0, the default: none); a layer's own setting wins.
	FillRate int64
	// RecordSeconds is how long a new sandbox's reads are recorded into its environment's
	// prefetch profile (default 10).
	RecordSeconds int
}

// withDefaults returns c with every zero limit replaced by its default.
func (c Config) withDefaults() Config {
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.MaxEntries == 0 {
		c.MaxEntries = DefaultMaxEntries
	}
	if c.MaxRatio == 0 {
		c.MaxRatio = DefaultMaxRatio
	}
	if c.RatioFloor == 0 {
		c.RatioFloor = DefaultRatioFloor
	}
	if c.SetID == "" {
		c.SetID = SetIDStrip
	}
	if c.Lazy.ChunkSize == 0 {
		c.Lazy.ChunkSize = 1 << 20
	}
	if c.Lazy.Mode == "" {
		c.Lazy.Mode = lazy.ModePrefetch
	}
	if c.Lazy.RecordSeconds == 0 {
		c.Lazy.RecordSeconds = 10
	}
	return c
}

// Validate reports the first invalid field of c, after defaults are applied.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Blobs == nil:
		return errdefs.Invalid("layers.blobs", "a blob store is required")
	case c.Dir == "":
		return errdefs.Invalid("layers.dir", "is required")
	case !filepath.IsAbs(c.Dir):
		return errdefs.Invalid("layers.dir", "must be an absolute path, got %q", c.Dir)
	case c.MaxBytes < 0:
		return errdefs.Invalid("layers.max_bytes", "must be positive, got %d", c.MaxBytes)
	case c.Linger < 0:
		return errdefs.Invalid("layers.linger", "must not be negative, got %v", c.Linger)
	case c.MaxEntries < 0:
		return errdefs.Invalid("layers.max_entries", "must be positive, got %d", c.MaxEntries)
	case c.MaxRatio < 0:
		return errdefs.Invalid("layers.max_ratio", "must be positive, got %d", c.MaxRatio)
	case c.RatioFloor < 0:
		return errdefs.Invalid("layers.ratio_floor", "must be positive, got %d", c.RatioFloor)
	case c.SetID != SetIDStrip && c.SetID != SetIDKeep:
		return errdefs.Invalid("layers.setid", "must be %q or %q, got %q", SetIDStrip, SetIDKeep, c.SetID)
	case c.Lazy.ChunkSize < 4096 || c.Lazy.ChunkSize > chunkcache.MaxChunkSize || c.Lazy.ChunkSize&(c.Lazy.ChunkSize-1) != 0:
		return errdefs.Invalid("layers.lazy.chunk_size", "must be a power of two from 4 KiB to 1 MiB, got %d", c.Lazy.ChunkSize)
	case !lazy.ValidMode(c.Lazy.Mode):
		return errdefs.Invalid("fetch", "must be eager, lazy or prefetch, got %q", c.Lazy.Mode)
	case c.Lazy.FillRate < 0:
		return errdefs.Invalid("fetch_fill_rate", "must not be negative, got %d", c.Lazy.FillRate)
	case c.Lazy.RecordSeconds < 0 || c.Lazy.RecordSeconds > 600:
		return errdefs.Invalid("fetch_record_seconds", "must be 0-600, got %d", c.Lazy.RecordSeconds)
	}
	return nil
}
