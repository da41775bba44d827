//go:build linux

package layers

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/erofs"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lazy"
	"github.com/corral-dev/corral/internal/trace"
)

// localFiles is implemented by blob stores whose objects are files this host can open (the
// directory backend, on a local disk or a shared mount): their images are mounted where they lie,
// with no copy in the node's cache.
type localFiles interface {
	LocalPath(key string) (string, error)
}

// filePutter is implemented by blob stores that can take a finished file without reading it
// through a stream (the directory backend renames it into place when it can).
type filePutter interface {
	PutFile(ctx context.Context, key, path string) error
}

// publish turns tree into a split EROFS image built in stage (a metadata image and a data blob
// with its chunk table), checks that it mounts to the same tree, and stores data, table, image and
// record in the blob store, the record last, so a record never names a missing object. The
// caller removes tree and stage.
func (s *Store) publish(ctx context.Context, stage, tree string, blob Blob) (Blob, error) {
	hexd, err := ParseDigest(blob.Digest)
	if err != nil {
		return Blob{}, err
	}
	img, data := filepath.Join(stage, imageName), filepath.Join(stage, dataName)
	if err := erofs.BuildSplit(ctx, tree, img, data, s.cfg.Lazy.ChunkSize); err != nil {
		return Blob{}, fmt.Errorf("convert to EROFS: %w", err)
	}
	if err := verifyImage(ctx, img, []string{data}, filepath.Join(stage, "verify"), blob.Digest); err != nil {
		return Blob{}, err
	}
	sum, size, err := hashFile(img)
	if err != nil {
		return Blob{}, err
	}
	dsum, dsize, err := hashFile(data)
	if err != nil {
		return Blob{}, err
	}
	chunks, err := erofs.Chunks(ctx, img, data, s.cfg.Lazy.ChunkSize)
	if err != nil {
		return Blob{}, fmt.Errorf("cut the data blob into chunks: %w", err)
	}
	dhex := strings.TrimPrefix(dsum, "sha256:")
	t := lazy.Table{DataKey: dataKey(dhex), DataSize: dsize, ChunkSize: s.cfg.Lazy.ChunkSize, Chunks: make([]lazy.Chunk, len(chunks))}
	for i, c := range chunks {
		t.Chunks[i] = lazy.Chunk(c)
	}
	if err := t.Check(); err != nil {
		return Blob{}, fmt.Errorf("chunk table: %w", err)
	}
	tb, err := json.Marshal(&t)
	if err != nil {
		return Blob{}, err
	}
	tsum := sha256.Sum256(tb)
	thex := hex.EncodeToString(tsum[:])
	blob.Image, blob.ImageSize = sum, size
	ihex := strings.TrimPrefix(sum, "sha256:")
	if _, local := s.blobs.(localFiles); !local {
		// The blob store is remote: keep this node's copy of the metadata (never the data: the
		// node's chunk cache fills only as sandboxes read).
		cached := filepath.Join(s.cacheDir, ihex+".erofs")
		if err := os.Link(img, cached); err != nil && !errors.Is(err, fs.ErrExist) {
			return Blob{}, fmt.Errorf("cache image: %w", err)
		}
	}
	if err := s.storeFile(ctx, dataKey(dhex), data, dsize); err != nil {
		return Blob{}, fmt.Errorf("store data blob in %s: %w", s.blobs, err)
	}
	if err := s.blobs.Put(ctx, tableKey(thex), bytes.NewReader(tb), int64(len(tb))); err != nil {
		return Blob{}, fmt.Errorf("store chunk table in %s: %w", s.blobs, err)
	}
	if err := s.storeFile(ctx, imageKey(ihex), img, size); err != nil {
		return Blob{}, fmt.Errorf("store image in %s: %w", s.blobs, err)
	}
	m := blobMeta{Digest: blob.Digest, Size: blob.Size, Files: blob.Files, Format: formatSplit,
		Image: sum, ImageSize: size, Data: dsum, DataSize: dsize, Table: "sha256:" + thex, TableSize: int64(len(tb)),
		Imported: time.Now().UTC(), ImportedBy: s.cfg.Instance}
	b, err := json.Marshal(m)
	if err != nil {
		return Blob{}, err
	}
	if err := s.blobs.Put(ctx, metaKey(hexd), bytes.NewReader(b), int64(len(b))); err != nil {
		return Blob{}, fmt.Errorf("store layer record in %s: %w", s.blobs, err)
	}
	s.mu.Lock()
	s.metas[blob.Digest] = m
	s.mu.Unlock()
	s.log.Info("layer published", "digest", blob.Digest, "image_bytes", size, "data_bytes", dsize, "chunks", len(chunks))
	return m.blob(), nil
}

// storeFile puts the file at path under key, renamed into place where the blob store can.
func (s *Store) storeFile(ctx context.Context, key, path string, size int64) error {
	if fp, ok := s.blobs.(filePutter); ok {
		return fp.PutFile(ctx, key, path)
	}
	return s.putFile(ctx, key, path, size)
}

func (s *Store) putFile(ctx context.Context, key, path string, size int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return s.blobs.Put(ctx, key, f, size)
}

// verifyImage mounts img at target and checks that the tree it shows has the layer's digest:
// the conversion lost or changed nothing the digest covers (content, modes, owners, links,
// devices, whiteouts, preserved xattrs).
func verifyImage(ctx context.Context, img string, devices []string, target, digest string) (err error) {
	if err := os.Mkdir(target, 0o700); err != nil {
		return err
	}
	if _, err := erofs.Mount(img, target, erofs.MountOptions{Devices: devices}); err != nil {
		return fmt.Errorf("verify EROFS image: %w", err)
	}
	defer func() {
		if uerr := erofs.Unmount(target); uerr != nil && err == nil {
			err = fmt.Errorf("verify EROFS image: %w", uerr)
		}
	}()
	got, err := digestTree(ctx, target, nil)
	if err != nil {
		return fmt.Errorf("verify EROFS image: %w", err)
	}
	if got.Digest != digest {
		return fmt.Errorf("verify EROFS image: it mounts as a tree with digest %s, not the imported %s (mkfs.erofs changed the layer)", got.Digest, digest)
	}
	return nil
}

// hashFile returns "sha256:<hex>" of a file's bytes and its size.
func hashFile(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("hash %s: %w", path, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), n, nil
}

// Acquire mounts the layer (once per node, however many sandboxes use it) and returns the
// directory to use as an overlay lower layer. Nobody may write to it. Every successful Acquire
// must be paired with a Release when the sandbox's overlay is gone. An image whose blob store
// has no local files is downloaded into the node's cache first and checked against its record.
// It fails with errdefs.ErrNotFound for a digest that is not stored.
func (s *Store) Acquire(ctx context.Context, digest string) (string, error) {
	m, err := s.meta(ctx, digest)
	if err != nil {
		return "", fmt.Errorf("mount layer: %w", err)
	}
	img, err := s.localImage(ctx, m)
	if errors.Is(err, errdefs.ErrNotFound) {
		// Another node may have published the same layer with another image since this process
		// read the record: read it again.
		s.forget(digest)
		if m, err = s.meta(ctx, digest); err == nil {
			img, err = s.localImage(ctx, m)
		}
	}
	if err != nil {
		return "", fmt.Errorf("mount layer %s: %w", digest, err)
	}
	hexd, _ := ParseDigest(digest)
	var dir string
	if m.Format == formatSplit {
		dir, err = s.acquireSplit(ctx, m, img)
	} else {
		dir, err = s.mounts.Acquire(hexd, img)
	}
	if err != nil {
		return "", fmt.Errorf("mount layer %s: %w", digest, err)
	}
	return dir, nil
}

// Files returns the files of a layer that Acquire mounted: its EROFS image and the image's extra
// devices (a split layer's data blob, as served by lazyd), for a VM that mounts the layer in
// its own kernel. Read them only: they are shared by every sandbox on the node.
func (s *Store) Files(ctx context.Context, digest string) (string, []string, error) {
	m, err := s.meta(ctx, digest)
	if err != nil {
		return "", nil, fmt.Errorf("layer files: %w", err)
	}
	img, err := s.localImage(ctx, m)
	if err != nil {
		return "", nil, fmt.Errorf("layer files %s: %w", digest, err)
	}
	if m.Format != formatSplit {
		return img, nil, nil
	}
	c, err := s.lazyClient(ctx)
	if err != nil {
		return "", nil, fmt.Errorf("layer files %s: %w", digest, err)
	}
	name, err := s.ensureTable(ctx, c, m)
	if err != nil {
		return "", nil, fmt.Errorf("layer files %s: %w", digest, err)
	}
	return img, []string{c.BlobPath(name)}, nil
}

// Release drops one reference taken by Acquire or Hold; the last one unmounts the layer.
func (s *Store) Release(digest string) error {
	hexd, err := ParseDigest(digest)
	if err != nil {
		return fmt.Errorf("release layer: %w", err)
	}
	return s.mounts.Release(hexd)
}

// Hold takes a reference on a layer that is still mounted from before a restart of the process
// (a sandbox that outlived it uses it). It reports false when the layer is not mounted.
func (s *Store) Hold(digest string) bool {
	hexd, err := ParseDigest(digest)
	return err == nil && s.mounts.Hold(hexd)
}

// Sweep unmounts every layer no reference holds: after a restart, once the surviving sandboxes
// have been re-adopted (Hold), it removes the mounts of those that did not survive.
func (s *Store) Sweep() (int, error) { return s.mounts.Sweep() }

// localImage returns a path on this host holding m's image: the blob store's own file, or the
// node's cached copy, downloaded and checked on first use. Concurrent callers share a download.
func (s *Store) localImage(ctx context.Context, m blobMeta) (string, error) {
	ihex, err := ParseDigest(m.Image)
	if err != nil {
		return "", err
	}
	if lf, ok := s.blobs.(localFiles); ok {
		return lf.LocalPath(imageKey(ihex))
	}
	p := filepath.Join(s.cacheDir, ihex+".erofs")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	s.mu.Lock()
	c, ok := s.fetch[ihex]
	if !ok {
		c = &fetchCall{done: make(chan struct{})}
		s.fetch[ihex] = c
		s.mu.Unlock()
		// The download is not tied to the first caller: a cancelled create must not fail others.
		c.path, c.err = s.download(context.WithoutCancel(ctx), m, p)
		s.mu.Lock()
		delete(s.fetch, ihex)
		s.mu.Unlock()
		close(c.done)
	} else {
		s.mu.Unlock()
	}
	select {
	case <-c.done:
		return c.path, c.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// download copies m's image from the blob store to p, checking its size and digest before it
// becomes visible under p.
func (s *Store) download(ctx context.Context, m blobMeta, p string) (_ string, err error) {
	ctx, span := trace.Start(ctx, trace.BlobFetch, trace.String("corral.layer.digest", m.Digest), trace.Int("corral.bytes", int(m.ImageSize)))
	defer span.End(&err)
	start := time.Now()
	ihex, _ := ParseDigest(m.Image)
	rc, err := s.blobs.Get(ctx, imageKey(ihex))
	if err != nil {
		return "", fmt.Errorf("fetch image %s from %s: %w", m.Image, s.blobs, err)
	}
	defer rc.Close()
	tmp, err := os.CreateTemp(s.cacheDir, ".fetch-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	defer tmp.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(rc, m.ImageSize+1))
	if err != nil {
		if isNoSpace(err) {
			return "", fmt.Errorf("fetch image %s: no space left in the node's image cache: %w", m.Image, errdefs.ErrExhausted)
		}
		return "", fmt.Errorf("fetch image %s from %s: %w", m.Image, s.blobs, err)
	}
	if sum := "sha256:" + hex.EncodeToString(h.Sum(nil)); n != m.ImageSize || sum != m.Image {
		return "", fmt.Errorf("fetch image %s from %s: got %d bytes hashing to %s; the record says %d bytes, %s (corrupt or replaced in the blob store)",
			m.Image, s.blobs, n, sum, m.ImageSize, m.Image)
	}
	if err := tmp.Sync(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return "", err
	}
	s.log.Info("layer image fetched", "digest", m.Digest, "image", m.Image, "bytes", n, "from", s.blobs.String(),
		"took", time.Since(start).Round(time.Millisecond))
	return p, nil
}

// CollectImages removes what no layer record names: images in the blob store older than
// orphanAge (an import writes its image before its record) and images in the node's cache that
// no sandbox has mounted. It returns how many it removed and their bytes.
func (s *Store) CollectImages(ctx context.Context) (removed int, bytes int64, err error) {
	blobs, err := s.List(ctx)
	if err != nil {
		return 0, 0, err
	}
	named := s.namedKeys(ctx, blobs)
	for _, prefix := range []string{imagePrefix, dataPrefix, tablePrefix} {
		infos, err := s.blobs.List(ctx, prefix)
		if err != nil {
			return removed, bytes, fmt.Errorf("list %s: %w", prefix, err)
		}
		for _, in := range infos {
			if named[in.Key] || time.Since(in.ModTime) < orphanAge {
				continue
			}
			if err := s.blobs.Delete(ctx, in.Key); err != nil {
				return removed, bytes, fmt.Errorf("delete orphaned %s: %w", in.Key, err)
			}
			removed, bytes = removed+1, bytes+in.Size
		}
	}
	// Prefetch profiles (profiles/<key hash>/<image hex>.json) of images no record names.
	profiles, err := s.blobs.List(ctx, "profiles/")
	if err != nil {
		return removed, bytes, fmt.Errorf("list profiles: %w", err)
	}
	for _, in := range profiles {
		ihex := strings.TrimSuffix(path.Base(in.Key), ".json")
		if named[imageKey(ihex)] || time.Since(in.ModTime) < orphanAge {
			continue
		}
		if err := s.blobs.Delete(ctx, in.Key); err != nil {
			return removed, bytes, fmt.Errorf("delete orphaned %s: %w", in.Key, err)
		}
		removed, bytes = removed+1, bytes+in.Size
	}
	entries, err := os.ReadDir(s.cacheDir)
	if err != nil {
		return removed, bytes, err
	}
	for _, e := range entries {
		ihex, ok := strings.CutSuffix(e.Name(), ".erofs")
		if !ok || named[imageKey(ihex)] {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		// A mounted image stays open through its mount; unlinking it frees the space at unmount.
		if err := os.Remove(filepath.Join(s.cacheDir, e.Name())); err == nil {
			removed, bytes = removed+1, bytes+fi.Size()
		}
	}
	return removed, bytes, nil
}

// namedKeys returns the blob store keys the records of blobs name: images, and the data blobs
// and chunk tables of split layers.
func (s *Store) namedKeys(ctx context.Context, blobs []Blob) map[string]bool {
	named := make(map[string]bool, 3*len(blobs))
	for _, b := range blobs {
		named[imageKey(strings.TrimPrefix(b.Image, "sha256:"))] = true
		if m, err := s.meta(ctx, b.Digest); err == nil && m.Format == formatSplit {
			dhex, _ := ParseDigest(m.Data)
			thex, _ := ParseDigest(m.Table)
			named[dataKey(dhex)], named[tableKey(thex)] = true, true
		}
	}
	return named
}

// orphanAge is how old an image no record names must be before CollectImages deletes it, so that
// an import between writing its image and its record is never robbed of the image.
const orphanAge = time.Hour

// migrateTrees converts the plain directory trees of stores written by Corral before layers were
// EROFS images (<Dir>/sha256/<hex>/fs) into images in the blob store, and removes each tree once
// no overlay mount of this host still uses it.
func (s *Store) migrateTrees(ctx context.Context) error {
	legacy := filepath.Join(s.cfg.Dir, "sha256")
	entries, err := os.ReadDir(legacy)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open layer store: %w", err)
	}
	mountinfo, _ := os.ReadFile("/proc/self/mountinfo")
	left := 0
	for _, e := range entries {
		digest := "sha256:" + e.Name()
		dir := filepath.Join(legacy, e.Name())
		tree := filepath.Join(dir, treeDir)
		if _, err := ParseDigest(digest); err != nil {
			continue
		}
		if bytes.Contains(mountinfo, []byte(tree)) {
			s.log.Warn("layer tree from an older Corral is still used by a sandbox; it is removed at a later start", "digest", digest, "dir", tree)
			left++
			continue
		}
		if _, err := s.meta(ctx, digest); errors.Is(err, errdefs.ErrNotFound) {
			if err := s.migrateTree(ctx, digest, tree); err != nil {
				s.log.Error("convert a layer tree from an older Corral; it stays as it is", "digest", digest, "err", err)
				left++
				continue
			}
		} else if err != nil {
			return fmt.Errorf("open layer store: %w", err)
		}
		if err := removeAll(dir); err != nil {
			return fmt.Errorf("open layer store: remove converted tree %s: %w", dir, err)
		}
	}
	if left == 0 {
		os.Remove(legacy)
	}
	return nil
}

func (s *Store) migrateTree(ctx context.Context, digest, tree string) error {
	stage, err := os.MkdirTemp(s.stagingDir, "migrate-")
	if err != nil {
		return err
	}
	defer removeAll(stage)
	blob, err := digestTree(ctx, tree, nil)
	if err != nil {
		return err
	}
	if blob.Digest != digest {
		return fmt.Errorf("the tree hashes to %s; it was changed after import", blob.Digest)
	}
	blob, err = s.publish(ctx, stage, tree, blob)
	if err != nil {
		return err
	}
	s.log.Info("layer converted to EROFS", "digest", digest, "image", blob.Image, "image_bytes", blob.ImageSize)
	return nil
}
