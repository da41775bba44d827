package agentrpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Watching a directory tree (opWatch). Each watch stream has its own inotify instance and one
// inotify watch per directory: the watched one and, when recursive, every directory below it,
// including those created or moved in later. The stream's reading goroutine turns the kernel's
// events into WatchEvents named relative to the watched directory and queues them; the
// connection's goroutine sends what is queued, in batches, as fast as the client reads.
//
// Everything is bounded: Config.MaxWatches streams per agent; Config.MaxWatchDirs directories
// per stream (a tree past it is refused at the start; one that grows past it ends the stream with
// ErrExhausted); Config.WatchQueue queued events per stream and watchQueueBytes of their names
// (past either, events are dropped and the client gets one overflow event where they were lost),
// and the kernel's own queue (its overflow is reported the same way). An event identical to the
// one queued just before it and not yet sent is folded into it.
//
// The watched directory is resolved like a move's paths (openInRoot) and not kept open (that
// would delay its IN_DELETE_SELF); to add watches below it, it is opened again by its path and
// must still be the same directory. Directories below it are opened beneath that descriptor
// without following any symbolic link (RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS) and watched through
// their own descriptor (/proc/self/fd/N), so a tree the sandbox rearranges while it is watched
// cannot lead the agent's watches elsewhere. A directory renamed inside the tree keeps its
// watches (they follow inodes) under its new name; one moved out loses them.
//
// The event of a new directory (created or moved in) is queued only once the directory is
// watched, so a client that has seen it knows later changes in it are reported. Entries found
// in a newly created directory are reported as created, since they were made before it was
// watched; one may then be reported twice. The stream ends when the watched directory is
// removed or moved away (a remove or rename event with an empty name, then the end frame) or
// when the client hangs up.

// watchMask is what every inotify watch of a stream asks for. IN_EXCL_UNLINK: nothing is reported
// about files after they are unlinked.
const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_ATTRIB |
	unix.IN_DELETE | unix.IN_DELETE_SELF | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_MOVE_SELF |
	unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

const (
	// watchQueueBytes bounds the names queued by one watch.
	watchQueueBytes = 256 << 10
	// watchFrameEvents is the most events one reply frame carries: even names of PATH_MAX bytes,
	// escaped in JSON, then fit a frame.
	watchFrameEvents = 32
	// maxWatchName is the longest name reported; deeper directories are not watched.
	maxWatchName = unix.PathMax
)

// errTooManyDirs ends a watch whose tree outgrew Config.MaxWatchDirs.
var errTooManyDirs = errors.New("too many directories")

// watch serves opWatch for connection c: dir (recursively, with recursive) until the client
// hangs up, ctx ends or the directory goes away.
func (s *Server) watch(ctx context.Context, c *conn, dir string, recursive bool) error {
	dir, err := cleanPath("path", dir)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.watches >= s.cfg.MaxWatches {
		s.mu.Unlock()
		return fmt.Errorf("watch %s: %d watches are open in this sandbox, the most it allows; close one first: %w", dir, s.cfg.MaxWatches, errdefs.ErrExhausted)
	}
	s.watches++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.watches--
		s.mu.Unlock()
	}()

	w, err := newWatcher(dir, recursive, s.cfg.MaxWatchDirs, s.cfg.WatchQueue)
	if err != nil {
		return err
	}
	go w.read()
	defer w.stop()
	if err := c.reply(reply{}); err != nil {
		return err
	}

	// The client sends nothing; its hanging up ends the stream.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer cancel()
		for {
			if _, _, err := c.f.readFrame(); err != nil {
				return
			}
		}
	}()

	var batch []WatchEvent
	for {
		finished := false
		select {
		case <-w.q.ready:
		case <-w.done:
			finished = true // everything the reader queued is queued by now
		case <-ctx.Done():
			return nil
		}
		batch = w.q.take(batch)
		for i := 0; i < len(batch); i += watchFrameEvents {
			if err := c.f.writeJSON(frameReply, reply{Events: batch[i:min(i+watchFrameEvents, len(batch))]}); err != nil {
				return err
			}
		}
		if finished {
			if w.err != nil {
				return w.err
			}
			if err := c.f.writeFrame(frameEnd, nil, nil); err != nil {
				return err
			}
		}
		if err := c.f.flush(); err != nil || finished {
			return err
		}
	}
}

// watcher is one watch stream's inotify instance and what it knows of the tree.
type watcher struct {
	path      string // the watched directory, clean and absolute
	recursive bool
	maxDirs   int
	viaProc   bool // watch through /proc/self/fd (else by path, without following the last component)

	ino     *os.File // the inotify instance, non-blocking: Read waits in the runtime's poller
	inoFD   int      // its descriptor, valid until ino is closed (after the reader is done)
	rootDev uint64   // the watched directory's device and inode, to recognise it when opened again
	rootIno uint64
	q       *watchQueue

	// Owned by the reading goroutine once it runs (by newWatcher before):
	dirs               map[int32]string // watch descriptor -> directory relative to path ("" is path)
	rootWD             int32
	lastType, lastName string // the last event the reader queued
	// moved is a directory of the tree whose IN_MOVED_FROM was the last event: when the next
	// is its IN_MOVED_TO (same cookie), its watches are renamed, else forgotten (moved out).
	moved *movedDir
	// lost is set when adding watches left something out (a directory too deep, entries of a
	// new directory beyond the queue's bound): an overflow is queued after the event at hand.
	lost bool

	done chan struct{} // closed when the reader returns
	err  error         // why the reader stopped: nil when the directory went away; written before done closes
}

func newWatcher(dir string, recursive bool, maxDirs, queue int) (*watcher, error) {
	root, err := openInRoot(dir, unix.O_PATH|unix.O_DIRECTORY)
	switch err {
	case nil:
	case unix.ENOENT:
		return nil, errdefs.NotFound("watch %s: no such directory", dir)
	case unix.ENOTDIR:
		return nil, errdefs.Invalid("path", "%s is not a directory", dir)
	case unix.ELOOP:
		return nil, errdefs.Invalid("path", "%s goes through a link into /proc (such as /proc/PID/root) or too many symbolic links: refused", dir)
	default:
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	// The directory is not kept open: an open descriptor would delay its IN_DELETE_SELF until it
	// is closed. It is opened again (and checked to be the same) to add watches below it.
	defer unix.Close(root)
	var st unix.Stat_t
	if err := unix.Fstat(root, &st); err != nil {
		return nil, &os.PathError{Op: "stat", Path: dir, Err: err}
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		if err == unix.EMFILE {
			return nil, fmt.Errorf("watch %s: the host's limit on inotify instances (fs.inotify.max_user_instances) is reached: %w", dir, errdefs.ErrExhausted)
		}
		return nil, fmt.Errorf("watch %s: inotify_init1: %w", dir, err)
	}
	w := &watcher{
		path: dir, recursive: recursive, maxDirs: maxDirs, rootDev: st.Dev, rootIno: st.Ino, inoFD: fd,
		ino: os.NewFile(uintptr(fd), "inotify"), q: newWatchQueue(queue),
		dirs: make(map[int32]string), done: make(chan struct{}),
	}
	_, statErr := os.Stat("/proc/self/fd")
	w.viaProc = statErr == nil
	wd, err := w.addDirAt(root, "")
	if err == nil {
		w.rootWD = wd
		if recursive {
			err = w.addTreeAt(root, "", nil)
		}
	}
	if err != nil {
		w.ino.Close()
		return nil, w.limitError(err)
	}
	w.reportLost()
	return w, nil
}

// limitError explains a failure to add watches.
func (w *watcher) limitError(err error) error {
	switch {
	case errors.Is(err, errTooManyDirs):
		return fmt.Errorf("watch %s: more than %d directories to watch, the most one watch covers; watch a smaller tree, or without recursive: %w", w.path, w.maxDirs, errdefs.ErrExhausted)
	case errors.Is(err, unix.ENOSPC):
		return fmt.Errorf("watch %s: the host's limit on inotify watches (fs.inotify.max_user_watches) is reached: %w", w.path, errdefs.ErrExhausted)
	}
	return fmt.Errorf("watch %s: %w", w.path, err)
}

// stop ends the reader and releases the watch. Preconditions: the reader was started.
func (w *watcher) stop() {
	if err := w.ino.SetReadDeadline(time.Unix(1, 0)); err != nil {
		w.ino.Close() // not pollable after all: closing is the only way left to end a Read
	}
	<-w.done
	w.ino.Close()
}

// openRoot opens the watched directory again (O_PATH), or fails with ENOENT when what its path
// names now is not the directory the watch began with.
func (w *watcher) openRoot() (int, error) {
	fd, err := openInRoot(w.path, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Dev != w.rootDev || st.Ino != w.rootIno {
		unix.Close(fd)
		return -1, unix.ENOENT
	}
	return fd, nil
}

// addDirAt adds an inotify watch on the directory rel below root (a descriptor of the watched
// directory).
func (w *watcher) addDirAt(root int, rel string) (int32, error) {
	target, mask := "/proc/self/fd/"+strconv.Itoa(root), uint32(watchMask)
	if rel != "" {
		fd, err := openBeneath(root, rel)
		if err != nil {
			return 0, err
		}
		defer unix.Close(fd)
		target = "/proc/self/fd/" + strconv.Itoa(fd)
	}
	if !w.viaProc {
		target, mask = path.Join(w.path, rel), mask|unix.IN_DONT_FOLLOW
	}
	wd, err := unix.InotifyAddWatch(w.inoFD, target, mask)
	if err != nil {
		return 0, err
	}
	if _, known := w.dirs[int32(wd)]; !known && len(w.dirs) >= w.maxDirs {
		unix.InotifyRmWatch(w.inoFD, uint32(wd))
		return 0, errTooManyDirs
	}
	w.dirs[int32(wd)] = rel
	return int32(wd), nil
}

// movedDir is a directory moved from rel by the rename cookie.
type movedDir struct {
	cookie uint32
	rel    string
}

// addTree watches rel and the directories below it. With found, it appends every entry it finds
// below rel (made before its directory was watched, when rel is new).
func (w *watcher) addTree(rel string, found *[]string) error {
	root, err := w.openRoot()
	if err != nil {
		return nil // the watched directory is going away; its own event ends the watch
	}
	defer unix.Close(root)
	return w.addTreeAt(root, rel, found)
}

// addTreeAt is addTree below root, a descriptor of the watched directory; rel itself is not
// watched again when it is the watched directory.
func (w *watcher) addTreeAt(root int, rel string, found *[]string) error {
	stack := []string{rel}
	for len(stack) > 0 {
		d := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if d != "" {
			if len(d) > maxWatchName {
				w.lost = true // not watched: what happens below it is not reported
				continue
			}
			if _, err := w.addDirAt(root, d); err != nil {
				if errors.Is(err, errTooManyDirs) || errors.Is(err, unix.ENOSPC) {
					return err
				}
				continue // gone, or replaced by something else, since it was seen
			}
		}
		fd, err := openBeneath(root, d, unix.O_RDONLY)
		if err != nil {
			continue
		}
		f := os.NewFile(uintptr(fd), d)
		for {
			ents, err := f.ReadDir(256)
			for _, e := range ents {
				child := path.Join(d, e.Name())
				switch {
				case found == nil:
				case len(*found) < w.q.max:
					*found = append(*found, child)
				default:
					w.lost = true // more than the queue holds: it would drop them
				}
				if e.IsDir() {
					if len(w.dirs)+len(stack) >= w.maxDirs {
						f.Close()
						return errTooManyDirs
					}
					stack = append(stack, child)
				}
			}
			if err != nil || len(ents) == 0 {
				break
			}
		}
		f.Close()
	}
	return nil
}

// forgetTree removes the watches on rel and every directory below it (moved out of the tree).
func (w *watcher) forgetTree(rel string) {
	for wd, d := range w.dirs {
		if d == rel || strings.HasPrefix(d, rel+"/") {
			unix.InotifyRmWatch(w.inoFD, uint32(wd))
			delete(w.dirs, wd)
		}
	}
}

// renameTree gives the watches of from and the directories below it the names under to (a
// rename inside the tree: the watches, which follow inodes, stay in place).
func (w *watcher) renameTree(from, to string) {
	for wd, d := range w.dirs {
		if d == from || strings.HasPrefix(d, from+"/") {
			w.dirs[wd] = to + d[len(from):]
		}
	}
}

// openBeneath opens the directory rel beneath root without following any symbolic link, by
// default as O_PATH (flags replaces that). "" is root itself.
func openBeneath(root int, rel string, flags ...int) (int, error) {
	fl := unix.O_PATH
	if len(flags) > 0 {
		fl = flags[0]
	}
	fl |= unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	if rel == "" {
		rel = "."
	}
	if !openat2Missing.Load() {
		fd, err := unix.Openat2(root, rel, &unix.OpenHow{
			Flags:   uint64(fl),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if err != unix.ENOSYS {
			return fd, err
		}
		openat2Missing.Store(true)
	}
	// One component at a time; rel holds no ".." (it is made of names the kernel reported).
	fd, err := unix.Openat(root, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	comps := strings.Split(rel, "/")
	for i, c := range comps {
		f := unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if i == len(comps)-1 {
			f = fl
		}
		next, err := unix.Openat(fd, c, f, 0)
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// read is the reading goroutine: it turns the kernel's events into queued WatchEvents until the
// watched directory goes away, reading fails, or stop.
func (w *watcher) read() {
	defer close(w.done)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.ino.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, os.ErrClosed) && err != io.EOF {
				w.err = fmt.Errorf("watch %s: read events: %w", w.path, err)
			}
			return
		}
		at := time.Now().UTC()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			wd := int32(binary.NativeEndian.Uint32(buf[off:]))
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			cookie := binary.NativeEndian.Uint32(buf[off+8:])
			nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
			off += unix.SizeofInotifyEvent
			name := buf[off:min(off+nameLen, n)]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			off += nameLen
			end, err := w.handle(wd, mask, cookie, string(name), at)
			if err != nil {
				w.err = w.limitError(err)
				return
			}
			if end {
				return
			}
		}
	}
}

// handle queues what one inotify event says. It reports end when the watched directory is gone.
// The event of a new directory (created or moved in) is queued once it is watched, so a client
// that sees it knows what happens in it from then on is reported.
func (w *watcher) handle(wd int32, mask, cookie uint32, name string, at time.Time) (end bool, err error) {
	movedIn := mask&unix.IN_MOVED_TO != 0 && w.moved != nil && w.moved.cookie == cookie
	if w.moved != nil && !movedIn {
		w.forgetTree(w.moved.rel)
		w.moved = nil
	}
	if mask&unix.IN_Q_OVERFLOW != 0 {
		w.q.overflowed()
		return false, nil
	}
	dir, ok := w.dirs[wd]
	if !ok {
		return false, nil // a watch already forgotten
	}
	if mask&unix.IN_IGNORED != 0 {
		delete(w.dirs, wd)
		if wd == w.rootWD {
			w.q.final(WatchEvent{Type: WatchRemove, At: at})
			return true, nil
		}
		return false, nil
	}
	rel := path.Join(dir, name)
	isDir := mask&unix.IN_ISDIR != 0
	switch {
	case mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_UNMOUNT) != 0:
		if wd != w.rootWD {
			return false, nil // its parent reports it
		}
		typ := WatchRemove
		if mask&unix.IN_MOVE_SELF != 0 {
			typ = WatchRename
		}
		w.q.final(WatchEvent{Type: typ, At: at})
		return true, nil
	case mask&unix.IN_CREATE != 0:
		var found []string
		if isDir && w.recursive {
			err = w.addTree(rel, &found)
		}
		w.push(WatchCreate, rel, at)
		for _, f := range found {
			w.push(WatchCreate, f, at) // made before its directory was watched
		}
		w.reportLost()
		return false, err
	case mask&unix.IN_MOVED_TO != 0:
		switch {
		case movedIn:
			w.renameTree(w.moved.rel, rel)
			w.moved = nil
		case isDir && w.recursive:
			err = w.addTree(rel, nil)
		}
		w.push(WatchRename, rel, at)
		w.reportLost()
		return false, err
	case mask&unix.IN_MOVED_FROM != 0:
		if isDir && w.recursive {
			w.moved = &movedDir{cookie: cookie, rel: rel}
		}
		w.push(WatchRename, rel, at)
	case mask&unix.IN_DELETE != 0:
		w.push(WatchRemove, rel, at)
	case mask&unix.IN_MODIFY != 0:
		w.push(WatchWrite, rel, at)
	case mask&unix.IN_CLOSE_WRITE != 0:
		if w.lastType != WatchWrite || w.lastName != rel {
			w.push(WatchWrite, rel, at) // closed after writing nothing reported yet
		}
	case mask&unix.IN_ATTRIB != 0:
		w.push(WatchChmod, rel, at)
	}
	return false, nil
}

// reportLost queues an overflow when adding watches left something out.
func (w *watcher) reportLost() {
	if w.lost {
		w.lost = false
		w.q.overflowed()
	}
}

func (w *watcher) push(typ, name string, at time.Time) {
	w.lastType, w.lastName = typ, name
	w.q.push(WatchEvent{Type: typ, Name: name, At: at})
}

// watchQueue holds a watch's events between its reader and its sender, within bounds. Its mu
// is a leaf lock.
type watchQueue struct {
	max   int
	ready chan struct{} // capacity 1: something was queued since the last take

	mu sync.Mutex
	// Protected by mu:
	events  []WatchEvent
	bytes   int // of the names in events
	dropped bool
	dropAt  int // with dropped: where in events the lost ones belonged
}

func newWatchQueue(max int) *watchQueue {
	return &watchQueue{max: max, ready: make(chan struct{}, 1)}
}

// push queues ev, folds it into the same event queued just before, or, over the bounds, drops it.
func (q *watchQueue) push(ev WatchEvent) {
	q.mu.Lock()
	switch n := len(q.events); {
	case q.dropped:
		// Dropping until the sender catches up: one overflow covers them all.
	case n > 0 && q.events[n-1].Type == ev.Type && q.events[n-1].Name == ev.Name:
	case n >= q.max || q.bytes+len(ev.Name) > watchQueueBytes:
		q.dropped, q.dropAt = true, n
	default:
		q.events = append(q.events, ev)
		q.bytes += len(ev.Name)
	}
	q.mu.Unlock()
	q.signal()
}

// overflowed records that events were lost before reaching the queue.
func (q *watchQueue) overflowed() {
	q.mu.Lock()
	if !q.dropped {
		q.dropped, q.dropAt = true, len(q.events)
	}
	q.mu.Unlock()
	q.signal()
}

// final queues the last event of the stream, whatever the bounds.
func (q *watchQueue) final(ev WatchEvent) {
	q.mu.Lock()
	q.events = append(q.events, ev)
	q.mu.Unlock()
	q.signal()
}

func (q *watchQueue) signal() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// take empties the queue into buf (reused), with an overflow event where events were lost.
func (q *watchQueue) take(buf []WatchEvent) []WatchEvent {
	q.mu.Lock()
	defer q.mu.Unlock()
	buf = buf[:0]
	if q.dropped {
		buf = append(buf, q.events[:q.dropAt]...)
		buf = append(buf, WatchEvent{Type: WatchOverflow, At: time.Now().UTC()})
		buf = append(buf, q.events[q.dropAt:]...)
	} else {
		buf = append(buf, q.events...)
	}
	clear(q.events)
	q.events, q.bytes, q.dropped, q.dropAt = q.events[:0], 0, false, 0
	return buf
}
