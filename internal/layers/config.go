//go:build linux

package layers

import (
	"path/filepath"

	"github.com/corral-dev/corral/internal/blobstore"
	"github.com/corral-dev/corral/internal/errdefs"
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
	// inheritance, not a privilege) is always kept. File capabilities (security.capability) are
	// always kept.
	SetID string

	// Blobs is the blob store of record for layer images and their records: a directory
	// (mounted in place) or S3 (downloaded into <Dir>/images on first use). Several nodes may
	// share one. Required.
	Blobs blobstore.Store

	// Instance names this Corral in the records it writes (store.Instance), so that other
	// Corrals sharing the blob store can tell its fresh imports from orphans.
	Instance string
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
	case c.MaxEntries < 0:
		return errdefs.Invalid("layers.max_entries", "must be positive, got %d", c.MaxEntries)
	case c.MaxRatio < 0:
		return errdefs.Invalid("layers.max_ratio", "must be positive, got %d", c.MaxRatio)
	case c.RatioFloor < 0:
		return errdefs.Invalid("layers.ratio_floor", "must be positive, got %d", c.RatioFloor)
	case c.SetID != SetIDStrip && c.SetID != SetIDKeep:
		return errdefs.Invalid("layers.setid", "must be %q or %q, got %q", SetIDStrip, SetIDKeep, c.SetID)
	}
	return nil
}
