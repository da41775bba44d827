// Package diskscan sums the disk images a runtime keeps in its sandboxes' directories, for the
// edge's disk promise, which asks on every create. Stat'ing every image on every create made
// admission O(sandboxes) under the edge's capacity lock: 2 ms a create with 100 sandboxes on a
// node, 20 ms with 1,000 (a glob and a stat per image). A Scan reads the directory's names
// (one getdents) and stats an image only when its directory is new to it, or when its figures
// are older than the scan's maxAge: an image whose blocks never change once its directory has
// its name (a sandbox's allocated disk) is read once.
package diskscan

import (
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Sum is what a Scan found.
type Sum struct {
	Images    int   // images found
	Size      int64 // their sizes (st_size)
	Allocated int64 // their allocated bytes on the filesystem, each at most its size
}

// Scanner caches the figures of the images under directories it scans. It is safe for
// concurrent use; its zero value is ready.
type Scanner struct {
	mu   sync.Mutex
	dirs map[string]map[string][]fig // by scanned directory, then entry: one per image name
	gen  uint64                      // Scan's count, to find entries a Scan did not list
	now  func() time.Time            // for tests; time.Now when nil
}

// fig is one path's figures; missing: no image there when read.
type fig struct {
	size, allocated int64
	missing         bool
	at              time.Time
	gen             uint64 // the last Scan that listed its entry
}

// Scan sums the images dir/*/name for each of names. An image's figures are reused for maxAge
// after they were read; maxAge < 0 reuses them for as long as their directory is there (for
// images that never change under that name), 0 reads every image on every call; a path found
// without an image is cached alike. Directories gone since the last Scan of dir are forgotten.
// A dir that cannot be read sums to nothing. Every Scan of one dir must pass the same names.
func (s *Scanner) Scan(dir string, names []string, maxAge time.Duration) Sum {
	var sum Sum
	// The names are read under the lock, so a Forget is either before (the directory is not
	// listed, or listed with its new image) or after (it drops what this Scan read).
	s.mu.Lock()
	defer s.mu.Unlock()
	f, err := os.Open(dir)
	if err != nil {
		return sum
	}
	entries, _ := f.Readdirnames(-1)
	f.Close()
	now := time.Now
	if s.now != nil {
		now = s.now
	}
	t := now()
	if s.dirs == nil {
		s.dirs = map[string]map[string][]fig{}
	}
	known := s.dirs[dir]
	if known == nil {
		known = map[string][]fig{}
		s.dirs[dir] = known
	}
	s.gen++
	for _, e := range entries {
		figs := known[e]
		if len(figs) != len(names) {
			figs = make([]fig, len(names)) // gen 0: never read
			known[e] = figs
		}
		for i, n := range names {
			fg := &figs[i]
			if fg.gen == 0 || maxAge == 0 || (maxAge > 0 && t.Sub(fg.at) >= maxAge) {
				*fg = read(filepath.Join(dir, e, n), t)
			}
			fg.gen = s.gen
			if !fg.missing {
				sum.Images++
				sum.Size += fg.size
				sum.Allocated += fg.allocated
			}
		}
	}
	for e, figs := range known {
		if figs[0].gen != s.gen {
			delete(known, e)
		}
	}
	return sum
}

// Forget drops what the Scanner knows of dir/entry, so the next Scan reads its images again.
// Call it once the directory is removed: one made again under the same name between two
// Scans would otherwise keep the figures (or the absence) of the one before.
func (s *Scanner) Forget(dir, entry string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.dirs[dir], entry)
}

func read(p string, at time.Time) fig {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fig{missing: true, at: at}
	}
	return fig{size: st.Size, allocated: min(st.Blocks*512, st.Size), at: at}
}
