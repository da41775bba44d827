//go:build linux

package layers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

const (
	metaFile = "blob.json"
	treeDir  = "fs"
)

// Blob describes a stored layer.
type Blob struct {
	Digest string // "sha256:<64 hex digits>" of the tree's canonical form
	Size   int64  // bytes of regular file content, each inode counted once
	Files  int64  // entries in the tree, not counting its root; each hardlink counts
}

// blobMeta is blob.json.
type blobMeta struct {
	Digest   string    `json:"digest"`
	Size     int64     `json:"size"`
	Files    int64     `json:"files"`
	Imported time.Time `json:"imported"`
}

// Store is a directory of layer blobs. See the package doc for its lifecycle.
type Store struct {
	cfg        Config
	log        *slog.Logger
	lock       *os.File // flock(LOCK_EX) on <Dir>/lock, held until Close
	blobsDir   string   // <Dir>/sha256
	stagingDir string   // <Dir>/staging
}

// Open opens the store in cfg.Dir, creating it if needed, and removes what a crashed process left
// in staging/. It fails with errdefs.ErrConflict if another Store holds the directory, and with
// errdefs.ErrUnavailable on a kernel without openat2(2) (Linux 5.6). A nil log discards.
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
		lock:       lock,
		blobsDir:   filepath.Join(cfg.Dir, "sha256"),
		stagingDir: filepath.Join(cfg.Dir, "staging"),
	}
	for _, d := range []string{s.blobsDir, s.stagingDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			s.Close()
			return nil, fmt.Errorf("open layer store: %w", err)
		}
	}
	if err := s.cleanStaging(); err != nil {
		s.Close()
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
		if err := removeAll(p); err != nil {
			return fmt.Errorf("open layer store: remove leftover %s: %w", p, err)
		}
	}
	if len(entries) > 0 {
		s.log.Info("removed leftover staging directories", "dir", s.stagingDir, "count", len(entries))
	}
	return nil
}

// Close releases the store's directory. No method may be called after Close.
func (s *Store) Close() error {
	return s.lock.Close() // closing the only descriptor drops the flock
}

// parseDigest validates "sha256:<64 lowercase hex digits>" and returns the hex part.
func parseDigest(digest string) (string, error) {
	hex, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(hex) != 64 || strings.Trim(hex, "0123456789abcdef") != "" {
		return "", errdefs.Invalid("digest", "want sha256:<64 lowercase hex digits>, got %q", digest)
	}
	return hex, nil
}

// Path returns the directory of a stored tree, to use as an overlay lowerdir. Nobody may write
// to it. It fails with errdefs.ErrNotFound for a digest that is not stored.
func (s *Store) Path(digest string) (string, error) {
	hex, err := parseDigest(digest)
	if err != nil {
		return "", fmt.Errorf("layer path: %w", err)
	}
	p := filepath.Join(s.blobsDir, hex, treeDir)
	if _, err := os.Lstat(p); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", errdefs.NotFound("layer %s", digest)
		}
		return "", fmt.Errorf("layer path %s: %w", digest, err)
	}
	return p, nil
}

// Stat describes a stored blob. It fails with errdefs.ErrNotFound for a digest that is not stored.
func (s *Store) Stat(digest string) (Blob, error) {
	hex, err := parseDigest(digest)
	if err != nil {
		return Blob{}, fmt.Errorf("stat layer: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(s.blobsDir, hex, metaFile))
	if errors.Is(err, fs.ErrNotExist) {
		return Blob{}, errdefs.NotFound("layer %s", digest)
	}
	if err != nil {
		return Blob{}, fmt.Errorf("stat layer %s: %w", digest, err)
	}
	var m blobMeta
	if err := json.Unmarshal(b, &m); err != nil || m.Digest != digest {
		return Blob{}, fmt.Errorf("stat layer %s: %s is corrupt", digest, metaFile)
	}
	return Blob{Digest: m.Digest, Size: m.Size, Files: m.Files}, nil
}

// List returns every stored blob, sorted by digest. A blob whose metadata cannot be read is
// logged and left out.
func (s *Store) List() ([]Blob, error) {
	entries, err := os.ReadDir(s.blobsDir)
	if err != nil {
		return nil, fmt.Errorf("list layers: %w", err)
	}
	var blobs []Blob
	for _, e := range entries {
		digest := "sha256:" + e.Name()
		if _, err := parseDigest(digest); err != nil {
			continue
		}
		b, err := s.Stat(digest)
		if err != nil {
			s.log.Warn("skip unreadable layer blob", "digest", digest, "err", err)
			continue
		}
		blobs = append(blobs, b)
	}
	return blobs, nil
}

// Remove deletes a blob. The caller (the catalogue) must make sure that no sandbox mounts it and
// that no import of the same digest is returning it. The blob leaves sha256/ with one rename, so
// it is either fully present or gone; if deleting its files fails midway they are removed at the
// next Open. It fails with errdefs.ErrNotFound for a digest that is not stored.
func (s *Store) Remove(digest string) error {
	hex, err := parseDigest(digest)
	if err != nil {
		return fmt.Errorf("remove layer: %w", err)
	}
	trash, err := os.MkdirTemp(s.stagingDir, "remove-")
	if err != nil {
		return fmt.Errorf("remove layer %s: %w", digest, err)
	}
	if err := os.Rename(filepath.Join(s.blobsDir, hex), filepath.Join(trash, hex)); err != nil {
		os.Remove(trash)
		if errors.Is(err, fs.ErrNotExist) {
			return errdefs.NotFound("layer %s", digest)
		}
		return fmt.Errorf("remove layer %s: %w", digest, err)
	}
	if err := removeAll(trash); err != nil {
		s.log.Error("delete removed layer; Open retries", "digest", digest, "dir", trash, "err", err)
	}
	s.log.Info("layer removed", "digest", digest)
	return nil
}

// Verify recomputes the digest of a stored tree, reading every file, and fails if the tree no
// longer matches its name.
func (s *Store) Verify(ctx context.Context, digest string) error {
	p, err := s.Path(digest)
	if err != nil {
		return fmt.Errorf("verify layer: %w", err)
	}
	got, err := digestTree(ctx, p, nil)
	if err != nil {
		return fmt.Errorf("verify layer %s: %w", digest, err)
	}
	if got.Digest != digest {
		return fmt.Errorf("verify layer %s: the tree on disk hashes to %s; it was changed after import", digest, got.Digest)
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

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
