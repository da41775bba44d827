//go:build linux

package layers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/blobstore"
	"github.com/corral-dev/corral/internal/erofs"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lazy"
)

const (
	treeDir   = "fs"          // an import's extracted tree, under staging/
	imageName = "layer.erofs" // an import's (metadata) image, under staging/
	dataName  = "layer.data"  // an import's data blob, under staging/
)

// Blob describes a stored layer.
type Blob struct {
	Digest    string    // "sha256:<64 hex digits>" of the tree's canonical form
	Size      int64     // bytes of regular file content, each inode counted once
	Files     int64     // entries in the tree, not counting its root; each hardlink counts
	Image     string    // "sha256:<hex>" of the EROFS image file
	ImageSize int64     // bytes of the EROFS image
	Imported  time.Time // when the record was written
	// ImportedBy is the instance (Config.Instance) that wrote the record, if it said.
	ImportedBy string
}

// blobMeta is the record layers/sha256/<hex>.json in the blob store. It is written after the
// image it names, so a record never points at a missing or partial image.
type blobMeta struct {
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
	Files     int64  `json:"files"`
	Format    string `json:"format"` // formatWhole or formatSplit
	Image     string `json:"image"`
	ImageSize int64  `json:"image_size"`
	// In formatSplit, Image holds the metadata only and Data the file contents (the image's
	// extra device), cut into the chunks the table Table (a lazy.Table, JSON) lists.
	Data      string    `json:"data,omitempty"`
	DataSize  int64     `json:"data_size,omitempty"`
	Table     string    `json:"table,omitempty"`
	TableSize int64     `json:"table_size,omitempty"`
	Imported  time.Time `json:"imported"`
	// ImportedBy is the importing Corral's instance name.
	ImportedBy string `json:"imported_by,omitempty"`
}

func (m blobMeta) blob() Blob {
	return Blob{Digest: m.Digest, Size: m.Size, Files: m.Files, Image: m.Image, ImageSize: m.ImageSize, Imported: m.Imported, ImportedBy: m.ImportedBy}
}

// Blob store keys.
func metaKey(hex string) string  { return "layers/sha256/" + hex + ".json" }
func imageKey(hex string) string { return "images/sha256/" + hex + ".erofs" }
func dataKey(hex string) string  { return "data/sha256/" + hex + ".blob" }
func tableKey(hex string) string { return "tables/sha256/" + hex + ".json" }

const (
	metaPrefix  = "layers/sha256/"
	imagePrefix = "images/sha256/"
	dataPrefix  = "data/sha256/"
	tablePrefix = "tables/sha256/"
)

// Record formats.
const (
	formatWhole = "erofs"       // one EROFS image holds the layer (imports before lazy loading)
	formatSplit = "erofs-split" // a metadata image plus a data blob fetched in chunks on demand
)

// Store is a node's view of the layer blob store. See the package doc for its lifecycle.
type Store struct {
	cfg        Config
	log        *slog.Logger
	blobs      blobstore.Store
	lock       *os.File // flock(LOCK_EX) on <Dir>/lock, held until Close
	stagingDir string   // <Dir>/staging
	cacheDir   string   // <Dir>/images: images fetched from a blob store without local files
	mounts     *erofs.Mounts

	mu        sync.Mutex
	metas     map[string]blobMeta      // digest -> record; records are immutable, so never stale
	fetch     map[string]*fetchCall    // image hex -> download in flight
	importing map[string]chan struct{} // digest -> closed when its import is published or failed

	lazyMu   sync.Mutex
	lazyc    *lazy.Client       // nil until a split layer is first used
	lazyStop context.CancelFunc // stops lazyd served in this process (Config.Lazy.Command nil)
	lazyDone chan error
}

// fetchCall is one download of an image that concurrent Acquires share.
type fetchCall struct {
	done chan struct{}
	path string
	err  error
}

// Open opens the store in cfg.Dir, creating it if needed, removes what a crashed process left in
// staging/ and adopts the layer mounts a previous process left (see Sweep). It fails with
// errdefs.ErrConflict if another Store holds the directory, with errdefs.ErrUnavailable on a
// kernel without openat2(2) (Linux 5.6) or a host without mkfs.erofs. A nil log discards.
func Open(cfg Config, log *slog.Logger) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("open layer store: %w", err)
	}
	cfg = cfg.withDefaults()
	cfg.Dir = filepath.Clean(cfg.Dir)
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := probeOpenat2(); err != nil {
		return nil, err
	}
	if _, err := erofs.Version(); err != nil {
		return nil, errdefs.Unavailable("open layer store: %v", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("open layer store: %w", err)
	}
	// Layers hold setuid binaries and file capabilities; host users must not reach them.
	if fi, err := os.Stat(cfg.Dir); err != nil {
		return nil, fmt.Errorf("open layer store: %w", err)
	} else if fi.Mode().Perm() != 0o700 {
		log.Warn("layer store directory was not private; setting mode 0700", "dir", cfg.Dir, "mode", fi.Mode().Perm())
		if err := os.Chmod(cfg.Dir, 0o700); err != nil {
			return nil, fmt.Errorf("open layer store: %w", err)
		}
	}
	lock, err := os.OpenFile(filepath.Join(cfg.Dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open layer store: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		if err == unix.EWOULDBLOCK {
			return nil, errdefs.Conflict("open layer store: %s is in use by another process", cfg.Dir)
		}
		return nil, fmt.Errorf("open layer store: lock %s: %w", cfg.Dir, err)
	}
	s := &Store{
		cfg:        cfg,
		log:        log,
		blobs:      cfg.Blobs,
		lock:       lock,
		stagingDir: filepath.Join(cfg.Dir, "staging"),
		cacheDir:   filepath.Join(cfg.Dir, "images"),
		metas:      map[string]blobMeta{},
		fetch:      map[string]*fetchCall{},
		importing:  map[string]chan struct{}{},
	}
	for _, d := range []string{s.stagingDir, s.cacheDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			s.lock.Close()
			return nil, fmt.Errorf("open layer store: %w", err)
		}
	}
	if err := s.cleanStaging(); err != nil {
		s.lock.Close()
		return nil, err
	}
	if s.mounts, err = erofs.OpenMounts(filepath.Join(cfg.Dir, "mnt"), log); err != nil {
		s.lock.Close()
		return nil, fmt.Errorf("open layer store: %w", err)
	}
	s.mounts.SetLinger(cfg.Linger)
	if err := s.migrateTrees(context.Background()); err != nil {
		s.lock.Close()
		return nil, err
	}
	return s, nil
}

func probeOpenat2() error {
	fd, err := unix.Openat2(unix.AT_FDCWD, "/", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
	if err == unix.ENOSYS {
		return errdefs.Unavailable("open layer store: the kernel lacks openat2(2); Linux 5.6 or newer is required")
	}
	if err != nil {
		return fmt.Errorf("open layer store: probe openat2: %w", err)
	}
	unix.Close(fd)
	return nil
}

// cleanStaging removes imports and removals that a crashed process left behind. The lock
// guarantees that no other process is using them.
func (s *Store) cleanStaging() error {
	entries, err := os.ReadDir(s.stagingDir)
	if err != nil {
		return fmt.Errorf("open layer store: %w", err)
	}
	for _, e := range entries {
		p := filepath.Join(s.stagingDir, e.Name())
		// An import that crashed while verifying its image left it mounted.
		unix.Unmount(filepath.Join(p, "verify"), unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		if err := removeAll(p); err != nil {
			return fmt.Errorf("open layer store: remove leftover %s: %w", p, err)
		}
	}
	if len(entries) > 0 {
		s.log.Info("removed leftover staging directories", "dir", s.stagingDir, "count", len(entries))
	}
	return nil
}

// Close unmounts the layers no sandbox holds and releases the store's directory. Layers that
// sandboxes hold stay mounted (the sandboxes outlive the process); the next Open adopts them. No
// method may be called after Close.
func (s *Store) Close() error {
	if _, err := s.mounts.Sweep(); err != nil {
		s.log.Warn("unmount unused layers at close", "err", err)
	}
	s.closeLazy()
	return s.lock.Close() // closing the only descriptor drops the flock
}

// ParseDigest validates "sha256:<64 lowercase hex digits>" and returns the hex part.
func ParseDigest(digest string) (string, error) {
	hex, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(hex) != 64 || strings.Trim(hex, "0123456789abcdef") != "" {
		return "", errdefs.Invalid("digest", "want sha256:<64 lowercase hex digits>, got %q", digest)
	}
	return hex, nil
}

// Stat describes a stored blob, as the blob store has it now. It fails with errdefs.ErrNotFound
// for a digest that is not stored.
func (s *Store) Stat(ctx context.Context, digest string) (Blob, error) {
	s.forget(digest)
	m, err := s.meta(ctx, digest)
	if err != nil {
		return Blob{}, fmt.Errorf("stat layer: %w", err)
	}
	return m.blob(), nil
}

// forget drops digest's record from memory, so that the next meta asks the blob store: another
// node may have removed it.
func (s *Store) forget(digest string) {
	s.mu.Lock()
	delete(s.metas, digest)
	s.mu.Unlock()
}

// meta returns digest's record, from memory or the blob store.
func (s *Store) meta(ctx context.Context, digest string) (blobMeta, error) {
	hex, err := ParseDigest(digest)
	if err != nil {
		return blobMeta{}, err
	}
	s.mu.Lock()
	m, ok := s.metas[digest]
	s.mu.Unlock()
	if ok {
		return m, nil
	}
	m, err = s.readMeta(ctx, metaKey(hex))
	if err != nil {
		return blobMeta{}, err
	}
	if m.Digest != digest {
		return blobMeta{}, fmt.Errorf("layer %s: its record in %s names %s", digest, s.blobs, m.Digest)
	}
	s.mu.Lock()
	s.metas[digest] = m
	s.mu.Unlock()
	return m, nil
}

// maxMetaBytes bounds a record read from the blob store.
const maxMetaBytes = 64 << 10

func (s *Store) readMeta(ctx context.Context, key string) (blobMeta, error) {
	rc, err := s.blobs.Get(ctx, key)
	if errors.Is(err, errdefs.ErrNotFound) {
		return blobMeta{}, errdefs.NotFound("layer %s", "sha256:"+strings.TrimSuffix(strings.TrimPrefix(key, metaPrefix), ".json"))
	}
	if err != nil {
		return blobMeta{}, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxMetaBytes+1))
	if err != nil {
		return blobMeta{}, fmt.Errorf("read %s from %s: %w", key, s.blobs, err)
	}
	var m blobMeta
	if len(b) > maxMetaBytes || json.Unmarshal(b, &m) != nil || (m.Format != formatWhole && m.Format != formatSplit) {
		return blobMeta{}, fmt.Errorf("%s in %s is not a Corral layer record: %w", key, s.blobs, errCorruptRecord)
	}
	if _, err := ParseDigest(m.Image); err != nil {
		return blobMeta{}, fmt.Errorf("%s in %s names a bad image digest %q: %w", key, s.blobs, m.Image, errCorruptRecord)
	}
	if m.Format == formatSplit {
		_, derr := ParseDigest(m.Data)
		_, terr := ParseDigest(m.Table)
		if derr != nil || terr != nil || m.DataSize < 0 || m.TableSize <= 0 || m.TableSize > maxTableBytes {
			return blobMeta{}, fmt.Errorf("%s in %s names a bad data blob or chunk table: %w", key, s.blobs, errCorruptRecord)
		}
	}
	return m, nil
}

// errCorruptRecord marks a layer record that was read but is not one.
var errCorruptRecord = errors.New("corrupt layer record")

// List returns every blob of the blob store, sorted by digest. A corrupt record is logged and
// left out; a record that could not be read fails the listing (a collector must never take a
// layer for unused because the store did not answer).
func (s *Store) List(ctx context.Context) ([]Blob, error) {
	infos, err := s.blobs.List(ctx, metaPrefix)
	if err != nil {
		return nil, fmt.Errorf("list layers: %w", err)
	}
	var blobs []Blob
	for _, in := range infos {
		hex, ok := strings.CutSuffix(strings.TrimPrefix(in.Key, metaPrefix), ".json")
		if !ok {
			continue
		}
		digest := "sha256:" + hex
		m, err := s.meta(ctx, digest)
		if errors.Is(err, errCorruptRecord) || errors.Is(err, errdefs.ErrNotFound) {
			s.log.Warn("skip a corrupt or vanished layer record", "digest", digest, "err", err)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list layers: %w", err)
		}
		blobs = append(blobs, m.blob())
	}
	return blobs, nil
}

// Remove deletes a blob from the blob store and this node's cache: its record first, so the
// image is never named by a record once deletion started, then its image. The caller (the
// catalogue) must make sure that nothing references it any more; a blob that a sandbox of this
// node holds mounted is refused with errdefs.ErrConflict. It fails with errdefs.ErrNotFound for
// a digest that is not stored.
func (s *Store) Remove(ctx context.Context, digest string) error {
	m, err := s.meta(ctx, digest)
	if err != nil {
		return fmt.Errorf("remove layer: %w", err)
	}
	hex, _ := ParseDigest(digest)
	if n := s.mounts.Refs(hex); n > 0 {
		return errdefs.Conflict("remove layer %s: %d sandboxes of this node have it mounted", digest, n)
	}
	if err := s.mounts.Drop(hex); err != nil {
		return fmt.Errorf("remove layer %s: %w", digest, err)
	}
	if err := s.blobs.Delete(ctx, metaKey(hex)); err != nil {
		return fmt.Errorf("remove layer %s: %w", digest, err)
	}
	s.forget(digest)
	if m.Format == formatSplit {
		s.removeSplitData(ctx, m)
	}
	img, _ := ParseDigest(m.Image)
	if err := s.blobs.Delete(ctx, imageKey(img)); err != nil {
		// An image no record names is removed by the next Collect.
		s.log.Error("delete a removed layer's image", "digest", digest, "image", m.Image, "err", err)
	}
	if err := os.Remove(filepath.Join(s.cacheDir, img+".erofs")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Error("delete a removed layer's cached image", "digest", digest, "err", err)
	}
	s.log.Info("layer removed", "digest", digest, "image", m.Image)
	return nil
}

// Verify checks a stored layer end to end: the image's bytes hash to the digest its record
// names, and the tree the image mounts hashes to the layer's digest.
func (s *Store) Verify(ctx context.Context, digest string) error {
	m, err := s.meta(ctx, digest)
	if err != nil {
		return fmt.Errorf("verify layer: %w", err)
	}
	img, err := s.localImage(ctx, m)
	if err != nil {
		return fmt.Errorf("verify layer %s: %w", digest, err)
	}
	if sum, _, err := hashFile(img); err != nil {
		return fmt.Errorf("verify layer %s: %w", digest, err)
	} else if sum != m.Image {
		return fmt.Errorf("verify layer %s: its image %s hashes to %s, not %s", digest, img, sum, m.Image)
	}
	dir, err := s.Acquire(ctx, digest)
	if err != nil {
		return fmt.Errorf("verify layer: %w", err)
	}
	defer s.Release(digest)
	got, err := digestTree(ctx, dir, nil)
	if err != nil {
		return fmt.Errorf("verify layer %s: %w", digest, err)
	}
	if got.Digest != digest {
		return fmt.Errorf("verify layer %s: the mounted image hashes to %s", digest, got.Digest)
	}
	return nil
}

// removeAll removes a tree, also when it holds directories the process may not write into.
func removeAll(p string) error {
	err := os.RemoveAll(p)
	if err == nil || os.Geteuid() == 0 {
		return err
	}
	filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(q, 0o700)
		}
		return nil
	})
	return os.RemoveAll(p)
}
