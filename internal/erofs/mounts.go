//go:build linux

package erofs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/mountinfo"
)

// Mounts is a reference-counted set of mounted images under one directory, one mount point per
// name: <dir>/<name>. Names are 64 lowercase hex digits (a layer digest). All methods are safe for
// concurrent use; none starts a goroutine but the linger timers (SetLinger). See the package doc
// for the lifecycle.
type Mounts struct {
	dir string
	log *slog.Logger

	// linger is how long a name stays mounted after its last Release (SetLinger). Protected by mu.
	linger time.Duration

	mu sync.Mutex
	// entries holds every name that is mounted or being mounted or unmounted. Protected by mu.
	entries map[string]*entry
}

// entry is the state of one name. All fields are protected by Mounts.mu.
type entry struct {
	refs int
	// busy is non-nil while one caller mounts or unmounts the name without holding mu; it is
	// closed when that ends. Others wait for it and then look again.
	busy    chan struct{}
	image   string   // the image file, as far as known ("" for an adopted loop mount we cannot trace)
	devices []string // its extra device files; nil when there are none or it was adopted
	backing Backing  // how it is mounted
	adopted bool     // found mounted by OpenMounts rather than mounted by Acquire
	// idle unmounts the name when it has lingered (SetLinger) with no reference; gen tells its
	// firing from a later Release's. Both protected by Mounts.mu.
	idle *time.Timer
	gen  uint64
}

// OpenMounts returns the set of mounts under dir, creating dir (mode 0700: images may hold setuid
// binaries and capabilities that host users must not reach) if needed. EROFS mounts that a
// previous process left at <dir>/<name> are adopted with zero references, so a restart neither
// remounts nor leaks them: Hold them for the sandboxes that still use them, then Sweep the rest.
// Empty directories that are not mount points are removed; anything else under dir is logged and
// left alone. log may be nil.
func OpenMounts(dir string, log *slog.Logger) (*Mounts, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open erofs mounts %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open erofs mounts %s: %w", dir, err)
	}
	// mountinfo shows real paths; resolve ours so they compare equal.
	real, err := filepath.EvalSymlinks(dir)
	if err == nil {
		real, err = filepath.Abs(real)
	}
	if err != nil {
		return nil, fmt.Errorf("open erofs mounts %s: %w", dir, err)
	}
	m := &Mounts{dir: real, log: log, entries: map[string]*entry{}}

	mis, err := readMountinfo()
	if err != nil {
		return nil, fmt.Errorf("open erofs mounts %s: %w", dir, err)
	}
	for _, mi := range mis {
		if filepath.Dir(mi.mountPoint) != real {
			continue
		}
		name := filepath.Base(mi.mountPoint)
		if mi.fsType != "erofs" || validName(name) != nil {
			log.Warn("foreign mount in erofs mount directory; leaving it", "mountpoint", mi.mountPoint, "fstype", mi.fsType)
			continue
		}
		if _, ok := m.entries[name]; ok {
			continue // stacked mounts at one point: unmount removes them all
		}
		e := &entry{adopted: true, image: mi.source, backing: Backing{Kind: BackingFile}}
		if strings.HasPrefix(mi.source, "/dev/loop") {
			e.backing = Backing{Kind: BackingLoop, Device: mi.source}
			e.image = loopBackingFile(mi.source)
		}
		m.entries[name] = e
		log.Info("adopted erofs mount", "name", name, "image", e.image, "backing", e.backing.Kind, "device", e.backing.Device)
	}

	ents, err := os.ReadDir(real)
	if err != nil {
		return nil, fmt.Errorf("open erofs mounts %s: %w", dir, err)
	}
	for _, de := range ents {
		if _, ok := m.entries[de.Name()]; ok {
			continue
		}
		p := filepath.Join(real, de.Name())
		if !de.IsDir() {
			log.Warn("unexpected file in erofs mount directory; leaving it", "path", p)
			continue
		}
		if err := unix.Rmdir(p); err != nil {
			log.Warn("cannot remove stale erofs mount point; leaving it", "path", p, "err", err)
			continue
		}
		log.Info("removed stale erofs mount point", "path", p)
	}
	return m, nil
}

// SetLinger makes a name stay mounted for d after its last Release, so that the next Acquire
// finds it mounted and its page cache warm (the files a sandbox's start reads, which would
// otherwise be read again through the image's backing, or fetched again through lazyd); 0, the
// default, unmounts at the last Release. Sweep and Drop unmount lingering names at once.
func (m *Mounts) SetLinger(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.linger = max(d, 0)
}

// Dir returns the directory the mount points are in.
func (m *Mounts) Dir() string { return m.dir }

// Acquire adds a reference to name and returns its mount point, mounting image there first if
// name is not mounted yet. image is not looked at when name is already mounted: a name stands for
// one content. Concurrent Acquires of one name mount it once: the others wait for that mount and
// then take a reference to it, or, if it failed, try again themselves. On error no reference is
// taken and nothing is left mounted.
func (m *Mounts) Acquire(name, image string) (string, error) {
	return m.AcquireDevices(name, image, nil)
}

// AcquireDevices is Acquire for an image with extra devices (MountOptions.Devices: the data blob
// of an image from BuildSplit). Like image, devices are not looked at when name is already
// mounted, so a mount adopted after a restart is shared as it is.
func (m *Mounts) AcquireDevices(name, image string, devices []string) (string, error) {
	if err := validName(name); err != nil {
		return "", err
	}
	target := filepath.Join(m.dir, name)
	m.mu.Lock()
	for {
		e := m.entries[name]
		if e == nil {
			break
		}
		if e.busy != nil {
			m.waitLocked(e.busy)
			continue
		}
		e.refs++
		e.stopIdle()
		m.mu.Unlock()
		return target, nil
	}
	e := &entry{busy: make(chan struct{}), image: image, devices: slices.Clone(devices)}
	m.entries[name] = e
	m.mu.Unlock()

	start := time.Now()
	b, err := m.mountAt(image, devices, target)

	m.mu.Lock()
	defer m.mu.Unlock()
	close(e.busy)
	e.busy = nil
	if err != nil {
		delete(m.entries, name)
		return "", err
	}
	e.refs, e.backing = 1, b
	m.log.Info("mounted erofs image", "name", name, "image", image, "extra_devices", devices, "backing", b.Kind,
		"device", b.Device, "device_loops", b.Devices, "direct_io", b.DirectIO, "took", time.Since(start))
	return target, nil
}

// mountAt creates the mount point and mounts image there; on error it removes the mount point.
func (m *Mounts) mountAt(image string, devices []string, target string) (Backing, error) {
	if err := os.Mkdir(target, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return Backing{}, fmt.Errorf("mount erofs image %s at %s: %w", image, target, err)
	}
	b, err := Mount(image, target, MountOptions{Devices: devices})
	if err != nil {
		unix.Rmdir(target)
		return Backing{}, err
	}
	return b, nil
}

// waitLocked waits for busy to close, releasing mu meanwhile.
//
// Preconditions: mu is held.
func (m *Mounts) waitLocked(busy chan struct{}) {
	m.mu.Unlock()
	<-busy
	m.mu.Lock()
}

// Hold adds a reference to name if it is mounted (by Acquire or adopted by OpenMounts) and reports
// whether it did. Use it to re-attach the sandboxes that survive a restart to their images.
func (m *Mounts) Hold(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for {
		e := m.entries[name]
		if e == nil {
			return false
		}
		if e.busy != nil {
			m.waitLocked(e.busy)
			continue
		}
		e.refs++
		e.stopIdle()
		return true
	}
}

// stopIdle cancels e's linger timer. Preconditions: Mounts.mu is held.
func (e *entry) stopIdle() {
	if e.idle != nil {
		e.idle.Stop()
		e.idle = nil
	}
	e.gen++ // a timer that fired already and waits for mu finds it stale
}

// Release drops a reference to name. The last one unmounts the image and removes its mount point,
// at once or, with SetLinger, once the name has gone unused for that long. If that unmount fails
// (still busy), the error is returned (logged, for a lingering one), the name stays mounted with
// zero references, and Sweep or a later Acquire and Release retries. Releasing a name that holds
// no reference wraps errdefs.ErrNotFound.
func (m *Mounts) Release(name string) error {
	m.mu.Lock()
	for {
		e := m.entries[name]
		if e == nil || (e.busy == nil && e.refs == 0) {
			m.mu.Unlock()
			return fmt.Errorf("release erofs mount %s: no reference held: %w", name, errdefs.ErrNotFound)
		}
		if e.busy != nil {
			m.waitLocked(e.busy)
			continue
		}
		e.refs--
		if e.refs > 0 {
			m.mu.Unlock()
			return nil
		}
		if m.linger > 0 {
			e.stopIdle()
			gen := e.gen
			e.idle = time.AfterFunc(m.linger, func() { m.expire(name, e, gen) })
			m.mu.Unlock()
			return nil
		}
		m.mu.Unlock()
		return m.unmount(name, e)
	}
}

// expire unmounts name when e, its entry, is still the one that lingered since the Release that
// set gen.
func (m *Mounts) expire(name string, e *entry, gen uint64) {
	m.mu.Lock()
	stale := m.entries[name] != e || e.gen != gen || e.refs != 0
	if !stale {
		e.idle = nil
	}
	m.mu.Unlock()
	if stale {
		return
	}
	if err := m.unmount(name, e); err != nil {
		m.log.Warn("unmount a lingering erofs image", "name", name, "err", err)
	}
}

// Drop unmounts name now if it is mounted with no reference (lingering, or left by a failed
// unmount), so that its image can go. It refuses a name that holds references with
// errdefs.ErrConflict; a name that is not mounted is no error.
func (m *Mounts) Drop(name string) error {
	m.mu.Lock()
	for {
		e := m.entries[name]
		if e == nil {
			m.mu.Unlock()
			return nil
		}
		if e.busy != nil {
			m.waitLocked(e.busy)
			continue
		}
		if e.refs > 0 {
			m.mu.Unlock()
			return errdefs.Conflict("erofs mount %s has %d references", name, e.refs)
		}
		e.stopIdle()
		m.mu.Unlock()
		return m.unmount(name, e)
	}
}

// Sweep unmounts every name that has no references: those adopted by OpenMounts and not Held,
// and those whose last Release failed to unmount. It returns how many it unmounted and the
// errors of those it could not.
func (m *Mounts) Sweep() (int, error) {
	m.mu.Lock()
	var idle []string
	for name, e := range m.entries {
		if e.busy == nil && e.refs == 0 {
			idle = append(idle, name)
		}
	}
	m.mu.Unlock()
	var n int
	var errs []error
	for _, name := range idle {
		m.mu.Lock()
		e := m.entries[name]
		if e == nil || e.busy != nil || e.refs != 0 { // changed meanwhile
			m.mu.Unlock()
			continue
		}
		m.mu.Unlock()
		if err := m.unmount(name, e); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// unmount unmounts name and removes its mount point. The caller has seen e with zero references
// and no busy channel, and has released mu since; unmount marks e busy again and re-checks.
func (m *Mounts) unmount(name string, e *entry) error {
	m.mu.Lock()
	if m.entries[name] != e || e.busy != nil || e.refs != 0 {
		m.mu.Unlock()
		return nil // someone else is on it or took a reference: not ours to unmount
	}
	busy := make(chan struct{})
	e.busy = busy
	e.stopIdle()
	m.mu.Unlock()

	target := filepath.Join(m.dir, name)
	err := unmountAll(target)
	if err == nil {
		if rerr := unix.Rmdir(target); rerr != nil && !errors.Is(rerr, unix.ENOENT) {
			m.log.Warn("remove erofs mount point", "path", target, "err", rerr)
		}
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	close(busy)
	e.busy = nil
	if err != nil {
		return fmt.Errorf("release erofs mount %s: %w", name, err)
	}
	delete(m.entries, name)
	m.log.Info("unmounted erofs image", "name", name, "image", e.image, "extra_devices", e.devices, "backing", e.backing.Kind,
		"adopted", e.adopted)
	return nil
}

// unmountAll unmounts target until no EROFS is mounted there (a crashed process may have stacked
// two mounts on one point). Finding none at all is not an error: someone else unmounted it.
func unmountAll(target string) error {
	for range 16 {
		err := Unmount(target)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return fmt.Errorf("unmount erofs at %s: still mounted after 16 unmounts", target)
}

// Refs returns the number of references to name; 0 when it is not mounted or adopted and unheld.
func (m *Mounts) Refs(name string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entries[name]; e != nil {
		return e.refs
	}
	return 0
}

// validName checks that name is a 64-digit lowercase hex string.
func validName(name string) error {
	if len(name) != 64 || strings.Trim(name, "0123456789abcdef") != "" {
		return errdefs.Invalid("name", "erofs mount name %q is not 64 lowercase hex digits", name)
	}
	return nil
}

// loopBackingFile returns the file behind a loop device, or "" if it cannot tell.
func loopBackingFile(dev string) string {
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop/backing_file"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// mountInfo is one line of /proc/self/mountinfo, the fields this package needs.
type mountInfo struct {
	id           string // unique per mount; a remount gets a new one
	mountPoint   string
	fsType       string
	source       string
	superOptions string
}

// readMountinfo parses /proc/self/mountinfo (proc(5)): mount ID, parent ID, major:minor, root,
// mount point, options, optional fields ended by "-", then fstype, source and super options.
func readMountinfo() ([]mountInfo, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return parseMountinfo(b)
}

func parseMountinfo(b []byte) ([]mountInfo, error) {
	var out []mountInfo
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if len(f) < 5 || sep < 0 || sep+2 >= len(f) {
			return nil, fmt.Errorf("parse mountinfo: malformed line %q", sc.Text())
		}
		out = append(out, mountInfo{
			id:           f[0],
			mountPoint:   mountinfo.Unescape(f[4]),
			fsType:       f[sep+1],
			source:       mountinfo.Unescape(f[sep+2]),
			superOptions: strings.Join(f[sep+3:], " "),
		})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("parse mountinfo: %w", err)
	}
	return out, nil
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }
