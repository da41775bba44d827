package edge

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/layers"
	corral "github.com/corral-dev/corral/sdk/go"
)

// Artifacts: files a call kept on the node (CallRequest.Keep) for a later call to take by
// reference (CallRequest.FileRefs) without a round trip through the client. Each is a file
// <dir>/<sha256 hex> with the mode it was kept with, named by the SHA-256 of its content, so the
// same output kept twice is stored once. An artifact lives for corral.ArtifactTTL after it was
// last kept or used (its mtime); the reaper removes older ones. The store holds at most
// maxArtifactBytes; keeping more removes the least recently used first.

const (
	maxArtifactFile  = 256 << 20
	maxArtifactBytes = 4 << 30
)

type artifacts struct {
	dir string
	mu  sync.Mutex // serialises eviction against keeping
}

func openArtifacts(dir string) (*artifacts, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("artifact store: %w", err)
	}
	return &artifacts{dir: dir}, nil
}

// put keeps r (at most maxArtifactFile bytes) with mode and returns its reference.
func (a *artifacts) put(r io.Reader, mode fs.FileMode) (string, error) {
	tmp, err := os.CreateTemp(a.dir, ".keep-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	defer tmp.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(r, maxArtifactFile+1))
	if err != nil {
		return "", err
	}
	if n > maxArtifactFile {
		return "", errdefs.Invalid("keep", "a kept file may have at most %d bytes", maxArtifactFile)
	}
	if err := tmp.Chmod(mode.Perm()); err != nil {
		return "", err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := os.Rename(tmp.Name(), filepath.Join(a.dir, sum)); err != nil {
		return "", err
	}
	a.evict(maxArtifactBytes)
	return "sha256:" + sum, nil
}

// open returns an artifact's content and mode and marks it used.
func (a *artifacts) open(ref string) (*os.File, fs.FileMode, error) {
	sum, err := layers.ParseDigest(ref)
	if err != nil {
		return nil, 0, errdefs.Invalid("file_refs", "%q is not an artifact reference (sha256:<64 hex digits>)", ref)
	}
	p := filepath.Join(a.dir, sum)
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, errdefs.NotFound("artifact %s (expired after %s, or kept on another node)", ref, corral.ArtifactTTL)
	}
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	now := time.Now()
	os.Chtimes(p, now, now)
	return f, fi.Mode(), nil
}

func isArtifactName(n string) bool {
	_, err := layers.ParseDigest("sha256:" + n)
	return err == nil
}

// expire removes artifacts unused for longer than ttl.
func (a *artifacts) expire(ttl time.Duration) {
	entries, _ := os.ReadDir(a.dir)
	for _, e := range entries {
		if !isArtifactName(e.Name()) {
			continue // a put in progress
		}
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > ttl {
			os.Remove(filepath.Join(a.dir, e.Name()))
		}
	}
}

// evict removes the least recently used artifacts until the store holds at most limit bytes.
// Preconditions: a.mu is held.
func (a *artifacts) evict(limit int64) {
	entries, _ := os.ReadDir(a.dir)
	type art struct {
		name string
		size int64
		used time.Time
	}
	var all []art
	var total int64
	for _, e := range entries {
		if !isArtifactName(e.Name()) {
			continue
		}
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			all = append(all, art{e.Name(), fi.Size(), fi.ModTime()})
			total += fi.Size()
		}
	}
	for total > limit && len(all) > 0 {
		oldest := 0
		for i, x := range all {
			if x.used.Before(all[oldest].used) {
				oldest = i
			}
		}
		os.Remove(filepath.Join(a.dir, all[oldest].name))
		total -= all[oldest].size
		all = append(all[:oldest], all[oldest+1:]...)
	}
}
