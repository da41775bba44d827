package volume

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// A cluster node's image of a volume is a cached copy of one version in the blob store. Its
// marker, <id>.ver ("VERSION DIGEST"), says which; an image without a marker is of no known
// version (a writer is attached, or its upload failed) and is fetched again before its next use.

const markerExt = ".ver"

func (d *Dir) marker(id string) string { return d.Path(id) + markerExt }

// Cached returns the version and digest of volume id's cached image; ok false when there is
// none, or the image's version is not known.
func (d *Dir) Cached(id string) (version int64, digest string, ok bool) {
	if !idRE.MatchString(id) {
		return 0, "", false
	}
	if _, err := os.Stat(d.Path(id)); err != nil {
		return 0, "", false
	}
	b, err := os.ReadFile(d.marker(id))
	if err != nil {
		return 0, "", false
	}
	v, dg, found := strings.Cut(strings.TrimSpace(string(b)), " ")
	n, err := strconv.ParseInt(v, 10, 64)
	if !found || err != nil {
		return 0, "", false
	}
	return n, dg, true
}

// SetCached records that volume id's image is version, with this digest.
func (d *Dir) SetCached(id string, version int64, digest string) error {
	if !idRE.MatchString(id) {
		return errdefs.Invalid("id", "%q is not a volume ID", id)
	}
	tmp := d.marker(id) + tmpExt
	if err := os.WriteFile(tmp, fmt.Appendf(nil, "%d %s\n", version, digest), 0o600); err != nil {
		return fmt.Errorf("record volume %s's version: %w", id, err)
	}
	if err := os.Rename(tmp, d.marker(id)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("record volume %s's version: %w", id, err)
	}
	return nil
}

// ClearCached forgets which version volume id's image is: call it before a writer changes it.
func (d *Dir) ClearCached(id string) error {
	if !idRE.MatchString(id) {
		return errdefs.Invalid("id", "%q is not a volume ID", id)
	}
	if err := os.Remove(d.marker(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("forget volume %s's version: %w", id, err)
	}
	return nil
}

// Import replaces volume id's image with the bytes of r, whose SHA-256 must be digest (hex);
// on a mismatch or error the image in place, if any, is kept and nothing else is left. A
// sandbox that has the old image mounted keeps it (the new one is renamed over it).
func (d *Dir) Import(id string, r io.Reader, digest string) (err error) {
	if !idRE.MatchString(id) {
		return errdefs.Invalid("id", "%q is not a volume ID", id)
	}
	tmp := d.Path(id) + tmpExt
	os.Remove(tmp) // a fetch cut short
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("import volume image: %w", err)
	}
	defer func() {
		f.Close()
		if err != nil {
			os.Remove(tmp)
		}
	}()
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(f, h), r); err != nil {
		return fmt.Errorf("import volume image: %w", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != digest {
		return fmt.Errorf("import volume %s: the image's digest is %s, want %s", id, got, digest)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync volume image: %w", err)
	}
	if err := os.Rename(tmp, d.Path(id)); err != nil {
		return fmt.Errorf("import volume image: %w", err)
	}
	return nil
}

// Open opens volume id's image for reading (an upload).
func (d *Dir) Open(id string) (*os.File, error) {
	if !idRE.MatchString(id) {
		return nil, errdefs.Invalid("id", "%q is not a volume ID", id)
	}
	return os.Open(d.Path(id))
}
