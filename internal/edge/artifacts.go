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
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/layers"
	"github.com/corral-dev/corral/internal/lazyregexp"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

// Artifacts: files a call kept on the node (CallRequest.Keep) for a later call to take by
// reference (CallRequest.FileRefs) without a round trip through the client. They belong to the
// project of the fncall environment whose call kept them: each is a file
// <dir>/<project ID>/<sha256 hex> with the mode it was kept with, and a reference is looked up in
// the calling environment's project only. A reference kept in another project is answered
// exactly as one never kept (same error, the same one failed open), and the same content kept in
// two projects is stored twice, so nothing about another project's files can be learnt, not
// even whether it holds a file of guessed content. Within a project the same output kept twice
// is stored once.
//
// An artifact's mtime is the moment it expires: CallRequest.KeepTTL (default corral.ArtifactTTL,
// at most corral.MaxArtifactTTL) after it was kept, pushed to at least corral.ArtifactTTL after
// each use. An expired artifact is not found from that moment and removed by the reaper. A
// project's artifacts on the node count against Quota.ArtifactBytes of it and its ancestors;
// the node as a whole holds at most maxArtifactBytes, the soonest to expire removed first when
// it would hold more (a last resort for the node's disk; the quotas keep projects well below).
//
// Lock order: artifacts.mu is a leaf; no store call is made while it is held.

const (
	maxArtifactFile  = 256 << 20
	maxArtifactBytes = 4 << 30
)

// projectIDRE matches the project IDs the store issues (iam.NewID), the only names of the
// store's project directories.
var projectIDRE = lazyregexp.New(`^prj-[a-z0-9]{1,64}$`)

type artifacts struct {
	dir string

	mu sync.Mutex
	// bytes is what each project's artifacts take; total their sum. Protected by mu.
	bytes map[string]int64
	total int64
}

func openArtifacts(dir string) (*artifacts, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("artifact store: %w", err)
	}
	a := &artifacts{dir: dir, bytes: map[string]int64{}}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("artifact store: %w", err)
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if !e.IsDir() || !projectIDRE.MatchString(e.Name()) {
			// Artifacts of an older Corral (<dir>/<sha256>) belong to no project; a put cut
			// short left the rest.
			os.RemoveAll(p)
			continue
		}
		files, _ := os.ReadDir(p)
		for _, f := range files {
			if fi, err := f.Info(); err == nil && isArtifactName(f.Name()) && fi.Mode().IsRegular() {
				a.bytes[e.Name()] += fi.Size()
				a.total += fi.Size()
			} else {
				os.Remove(filepath.Join(p, f.Name()))
			}
		}
	}
	return a, nil
}

// projectDir returns the directory of the project's artifacts.
func (a *artifacts) projectDir(project string) (string, error) {
	if !projectIDRE.MatchString(project) {
		return "", fmt.Errorf("artifact store: %q is not a project ID", project)
	}
	return filepath.Join(a.dir, project), nil
}

// put keeps r (at most maxArtifactFile bytes) with mode in project's artifacts for ttl, within
// limits, and returns its reference; created says the content was not kept in the project
// before (undo then removes it). A kept file that would take a project past a limit is an
// *iam.QuotaError, and nothing is kept.
func (a *artifacts) put(project string, r io.Reader, mode fs.FileMode, ttl time.Duration, limits []store.ArtifactLimit) (ref string, created bool, err error) {
	dir, err := a.projectDir(project)
	if err != nil {
		return "", false, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", false, err
	}
	tmp, err := os.CreateTemp(dir, ".keep-*")
	if err != nil {
		return "", false, err
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	defer tmp.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(r, maxArtifactFile+1))
	if err != nil {
		return "", false, err
	}
	if n > maxArtifactFile {
		return "", false, errdefs.Invalid("keep", "a kept file may have at most %d bytes", maxArtifactFile)
	}
	if err := tmp.Chmod(mode.Perm()); err != nil {
		return "", false, err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	ref = "sha256:" + sum
	p := filepath.Join(dir, sum)
	now := time.Now()
	until := now.Add(ttl)
	a.mu.Lock()
	defer a.mu.Unlock()
	if fi, err := os.Stat(p); err == nil {
		if fi.ModTime().After(now) {
			// Kept already: it lives on until the later of both lifetimes.
			if until.After(fi.ModTime()) {
				os.Chtimes(p, until, until)
			}
			return ref, false, nil
		}
		a.removeLocked(project, p, fi.Size()) // expired: kept anew
	}
	for _, l := range limits {
		var used int64
		for _, id := range l.Projects {
			used += a.bytes[id]
		}
		if used+n > l.Limit {
			return "", false, &iam.QuotaError{QuotaExceeded: iam.QuotaExceeded{
				Project: iam.Display(l.Path), Resource: "artifact_bytes", Limit: float64(l.Limit), Usage: float64(used), Request: float64(n),
			}}
		}
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return "", false, err
	}
	if err := os.Chtimes(p, until, until); err != nil {
		os.Remove(p)
		return "", false, err
	}
	a.bytes[project] += n
	a.total += n
	a.evictLocked(maxArtifactBytes)
	return ref, true, nil
}

// notKept is the answer for a reference the project cannot use: never kept, kept in another
// project, expired or removed all read the same.
func notKept(ref string) error {
	return errdefs.NotFound("artifact %s is not kept on this node for this project (artifacts expire, see keep_ttl, and stay on the node and in the project that kept them)", ref)
}

// open returns an artifact of project, its content and mode, and keeps it at least
// corral.ArtifactTTL longer.
func (a *artifacts) open(project, ref string) (*os.File, fs.FileMode, error) {
	sum, err := layers.ParseDigest(ref)
	if err != nil {
		return nil, 0, errdefs.Invalid("file_refs", "%q is not an artifact reference (sha256:<64 hex digits>)", ref)
	}
	dir, err := a.projectDir(project)
	if err != nil {
		return nil, 0, err
	}
	p := filepath.Join(dir, sum)
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, notKept(ref)
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
	if !fi.ModTime().After(now) {
		f.Close()
		a.mu.Lock()
		// Unless kept again meanwhile (a new file, a later time).
		if cur, err := os.Stat(p); err == nil && os.SameFile(cur, fi) && !cur.ModTime().After(now) {
			a.removeLocked(project, p, cur.Size())
		}
		a.mu.Unlock()
		return nil, 0, notKept(ref)
	}
	if until := now.Add(model.ArtifactTTL); until.After(fi.ModTime()) {
		os.Chtimes(p, until, until)
	}
	return f, fi.Mode(), nil
}

// remove drops an artifact that put created for a call that then failed.
func (a *artifacts) remove(project, ref string) {
	sum, err := layers.ParseDigest(ref)
	dir, derr := a.projectDir(project)
	if err != nil || derr != nil {
		return
	}
	p := filepath.Join(dir, sum)
	a.mu.Lock()
	defer a.mu.Unlock()
	if fi, err := os.Stat(p); err == nil {
		a.removeLocked(project, p, fi.Size())
	}
}

// removeLocked removes the artifact file p of project, of size bytes.
// Preconditions: a.mu is held.
func (a *artifacts) removeLocked(project, p string, size int64) {
	if err := os.Remove(p); err != nil {
		return
	}
	a.bytes[project] -= size
	a.total -= size
	if a.bytes[project] <= 0 {
		delete(a.bytes, project)
	}
}

// used returns the bytes the artifacts of the projects with these IDs take.
func (a *artifacts) used(projects ...string) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n int64
	for _, p := range projects {
		n += a.bytes[p]
	}
	return n
}

func isArtifactName(n string) bool {
	_, err := layers.ParseDigest("sha256:" + n)
	return err == nil
}

// artifact is one kept file, for expiry and eviction.
type artifact struct {
	project, path string
	size          int64
	until         time.Time
}

// listLocked returns every artifact.
// Preconditions: a.mu is held.
func (a *artifacts) listLocked() []artifact {
	var all []artifact
	projects, _ := os.ReadDir(a.dir)
	for _, pd := range projects {
		if !pd.IsDir() || !projectIDRE.MatchString(pd.Name()) {
			continue
		}
		dir := filepath.Join(a.dir, pd.Name())
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if !isArtifactName(e.Name()) {
				continue // a put in progress
			}
			if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
				all = append(all, artifact{pd.Name(), filepath.Join(dir, e.Name()), fi.Size(), fi.ModTime()})
			}
		}
	}
	return all
}

// expire removes the artifacts whose time is up.
func (a *artifacts) expire() {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	for _, x := range a.listLocked() {
		if !x.until.After(now) {
			a.removeLocked(x.project, x.path, x.size)
		}
	}
}

// evictLocked removes the artifacts soonest to expire until the node holds at most limit bytes.
// Preconditions: a.mu is held.
func (a *artifacts) evictLocked(limit int64) {
	if a.total <= limit {
		return
	}
	all := a.listLocked()
	for a.total > limit && len(all) > 0 {
		first := 0
		for i, x := range all {
			if x.until.Before(all[first].until) {
				first = i
			}
		}
		a.removeLocked(all[first].project, all[first].path, all[first].size)
		all = append(all[:first], all[first+1:]...)
	}
}
