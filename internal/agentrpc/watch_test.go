package agentrpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

func TestMove(t *testing.T) {
	c, _ := startServer(t, nil)
	ctx := testCtx(t)
	dir := t.TempDir()
	p := func(name string) string { return filepath.Join(dir, name) }
	os.WriteFile(p("a"), []byte("a"), 0o640)
	os.WriteFile(p("old"), []byte("old"), 0o644)
	os.MkdirAll(p("sub/full/x"), 0o755)
	os.Mkdir(p("empty"), 0o755)

	// A file replaces another, as rename(2) does.
	fi, err := c.Move(ctx, p("a"), p("old"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Path != p("old") || fi.Name != "old" || fi.Size != 1 || fi.Mode.Perm() != 0o640 || fi.IsDir {
		t.Errorf("Move = %+v", fi)
	}
	if b, _ := os.ReadFile(p("old")); string(b) != "a" {
		t.Errorf("destination holds %q, want the source's content", b)
	}
	if _, err := os.Lstat(p("a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("source still there: %v", err)
	}
	// A directory replaces an empty one.
	if fi, err := c.Move(ctx, p("sub/full"), p("empty")); err != nil || !fi.IsDir {
		t.Errorf("directory over an empty one: %+v, %v", fi, err)
	}
	// A symbolic link is moved itself, not its target.
	os.Symlink("old", p("link"))
	if fi, err := c.Move(ctx, p("link"), p("link2")); err != nil || fi.Link != "old" || fi.Mode&os.ModeSymlink == 0 {
		t.Errorf("moving a link: %+v, %v", fi, err)
	}
	// A symbolic link to a directory inside is followed on the way to the destination.
	os.Symlink(p("sub"), p("tosub"))
	if _, err := c.Move(ctx, p("old"), p("tosub/moved")); err != nil {
		t.Errorf("destination through a link: %v", err)
	} else if _, err := os.Stat(p("sub/moved")); err != nil {
		t.Errorf("not moved through the link: %v", err)
	}

	for _, tt := range []struct {
		name     string
		src, dst string
		kind     error
		msg      string
	}{
		{"missing source", p("nope"), p("x"), errdefs.ErrNotFound, "no such file"},
		{"missing parent", p("sub/moved"), p("no/such/x"), errdefs.ErrNotFound, "parent directory"},
		{"relative source", "../../etc/passwd", p("x"), errdefs.ErrInvalid, "absolute"},
		{"relative destination", p("sub/moved"), "../../etc/x", errdefs.ErrInvalid, "absolute"},
		{"into itself", p("sub"), p("sub/inner"), errdefs.ErrInvalid, "into itself"},
		{"root", "/", p("x"), errdefs.ErrInvalid, "refusing"},
		{"over a non-empty directory", p("empty"), p("sub"), errdefs.ErrConflict, "not empty"},
		{"file over a directory", p("sub/moved"), p("empty"), errdefs.ErrConflict, "is a directory"},
		{"directory over a file", p("empty"), p("sub/moved"), errdefs.ErrConflict, "is not"},
		{"parent is a file", p("empty"), p("sub/moved/x"), errdefs.ErrInvalid, "not a directory"},
	} {
		_, err := c.Move(ctx, tt.src, tt.dst)
		if !errors.Is(err, tt.kind) || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%s: %v, want %v saying %q", tt.name, err, tt.kind, tt.msg)
		}
	}

	// A path through /proc's per-process links is refused, whatever it would reach.
	os.Symlink("/proc/self/root", p("proc"))
	_, err = c.Move(ctx, p("sub/moved"), p("proc")+dir+"/escaped")
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "/proc") {
		t.Errorf("through /proc/self/root: %v, want ErrInvalid naming /proc", err)
	}
	if _, err := os.Lstat(p("escaped")); err == nil {
		t.Error("moved through /proc/self/root")
	}

	// Another mount: refused, nothing copied.
	var a, b syscall.Stat_t
	if syscall.Stat(dir, &a) == nil && syscall.Stat("/dev/shm", &b) == nil && a.Dev != b.Dev {
		target := fmt.Sprintf("/dev/shm/corral-move-test-%d", os.Getpid())
		_, err := c.Move(ctx, p("sub/moved"), target)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "different mounts") {
			t.Errorf("across mounts: %v, want ErrInvalid saying different mounts", err)
		}
		if _, err := os.Lstat(target); err == nil {
			os.Remove(target)
			t.Error("moved across mounts")
		}
	}
}

// watchStream collects a watch's events.
type watchStream struct {
	t      *testing.T
	w      *Watch
	events chan WatchEvent
	err    error // why the stream ended; read after events is closed
	seen   []WatchEvent
}

func startWatch(t *testing.T, c *Client, dir string, recursive bool) *watchStream {
	t.Helper()
	w, err := c.Watch(testCtx(t), dir, recursive)
	if err != nil {
		t.Fatalf("Watch %s: %v", dir, err)
	}
	t.Cleanup(func() { w.Close() })
	ws := &watchStream{t: t, w: w, events: make(chan WatchEvent, 1<<16)}
	go func() {
		defer close(ws.events)
		for {
			ev, err := w.Next()
			if err != nil {
				ws.err = err
				return
			}
			ws.events <- ev
		}
	}()
	return ws
}

// until reads events until one of type typ for name arrives; it fails the test after 10s or when
// the stream ends first.
func (ws *watchStream) until(typ, name string) {
	ws.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-ws.events:
			if !ok {
				ws.t.Fatalf("watch ended (%v) before %s %q; saw %v", ws.err, typ, name, ws.seen)
			}
			ws.seen = append(ws.seen, ev)
			if ev.Type == typ && ev.Name == name {
				return
			}
		case <-timeout:
			ws.t.Fatalf("no %s %q within 10s; saw %v", typ, name, ws.seen)
		}
	}
}

// end reads events until the stream ends and returns its error.
func (ws *watchStream) end() error {
	ws.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-ws.events:
			if !ok {
				return ws.err
			}
			ws.seen = append(ws.seen, ev)
		case <-timeout:
			ws.t.Fatalf("watch still open after 10s; saw %v", ws.seen)
		}
	}
}

func (ws *watchStream) saw(typ, name string) bool {
	return slices.ContainsFunc(ws.seen, func(ev WatchEvent) bool { return ev.Type == typ && ev.Name == name })
}

func TestWatch(t *testing.T) {
	c, _ := startServer(t, nil)
	dir := t.TempDir()
	p := func(name string) string { return filepath.Join(dir, name) }
	os.Mkdir(p("before"), 0o755)
	ws := startWatch(t, c, dir, false)

	os.WriteFile(p("f"), []byte("x"), 0o644)
	ws.until(WatchCreate, "f")
	ws.until(WatchWrite, "f")
	f, _ := os.OpenFile(p("f"), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("more")
	f.Close()
	ws.until(WatchWrite, "f")
	os.Chmod(p("f"), 0o600)
	ws.until(WatchChmod, "f")
	os.Rename(p("f"), p("g"))
	ws.until(WatchRename, "f")
	ws.until(WatchRename, "g")
	// Not recursive: nothing below the directory itself.
	os.WriteFile(p("before/inner"), nil, 0o644)
	os.Remove(p("g"))
	ws.until(WatchRemove, "g")
	if ws.saw(WatchCreate, "before/inner") {
		t.Error("a non-recursive watch reported a change in a subdirectory")
	}
	for _, ev := range ws.seen {
		if ev.At.IsZero() || time.Since(ev.At) > time.Minute {
			t.Errorf("event %+v has a bad time", ev)
		}
	}
	// Removing the watched directory ends the watch: its remove, then the end.
	os.RemoveAll(dir)
	if err := ws.end(); err != io.EOF {
		t.Errorf("watch of a removed directory ended with %v, want io.EOF", err)
	}
	if last := ws.seen[len(ws.seen)-1]; last.Type != WatchRemove || last.Name != "" {
		t.Errorf("last event %+v, want the directory's remove", last)
	}
	if !ws.saw(WatchRemove, "before") {
		t.Errorf("no remove of the subdirectory; saw %v", ws.seen)
	}
}

func TestWatchRecursive(t *testing.T) {
	c, _ := startServer(t, nil)
	dir := filepath.Join(t.TempDir(), "tree")
	outside := t.TempDir()
	p := func(name string) string { return filepath.Join(dir, name) }
	os.MkdirAll(p("a/b"), 0o755)
	ws := startWatch(t, c, dir, true)

	// A directory that existed before the watch.
	os.WriteFile(p("a/b/f"), nil, 0o644)
	ws.until(WatchCreate, "a/b/f")
	// One made after it, and a tree made at once (entries made before their directory was
	// watched are reported as created).
	os.Mkdir(p("new"), 0o755)
	ws.until(WatchCreate, "new")
	os.WriteFile(p("new/f"), []byte("x"), 0o644)
	ws.until(WatchWrite, "new/f")
	os.MkdirAll(p("deep/er/est"), 0o755)
	os.WriteFile(p("deep/er/est/g"), nil, 0o644)
	ws.until(WatchCreate, "deep/er/est/g")
	// A directory moved in is watched; one moved out is not any more.
	os.MkdirAll(filepath.Join(outside, "in/x"), 0o755)
	os.Rename(filepath.Join(outside, "in"), p("in"))
	ws.until(WatchRename, "in")
	os.WriteFile(p("in/x/y"), nil, 0o644)
	ws.until(WatchCreate, "in/x/y")
	os.Rename(p("a"), filepath.Join(outside, "a"))
	ws.until(WatchRename, "a")
	os.WriteFile(filepath.Join(outside, "a/b/after"), nil, 0o644)
	// A directory renamed inside the tree is watched under its new name.
	os.Rename(p("new"), p("renamed"))
	ws.until(WatchRename, "renamed")
	os.WriteFile(p("renamed/h"), nil, 0o644)
	ws.until(WatchCreate, "renamed/h")
	os.Remove(p("renamed/h"))
	ws.until(WatchRemove, "renamed/h")
	if ws.saw(WatchCreate, "a/b/after") {
		t.Error("a directory moved out of the tree is still watched")
	}
	// Moving the watched directory away ends the watch.
	os.Rename(dir, filepath.Join(outside, "tree"))
	if err := ws.end(); err != io.EOF {
		t.Errorf("watch of a moved directory ended with %v, want io.EOF", err)
	}
	if last := ws.seen[len(ws.seen)-1]; last.Type != WatchRename || last.Name != "" {
		t.Errorf("last event %+v, want the directory's rename", last)
	}
}

func TestWatchRefusals(t *testing.T) {
	c, _ := startServer(t, func(cfg *Config) { cfg.MaxWatches, cfg.MaxWatchDirs = 2, 4 })
	ctx := testCtx(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "file"), nil, 0o644)
	os.Symlink("/proc/self/root", filepath.Join(dir, "proc"))
	for _, tt := range []struct {
		path string
		kind error
	}{
		{filepath.Join(dir, "missing"), errdefs.ErrNotFound},
		{filepath.Join(dir, "file"), errdefs.ErrInvalid},
		{"relative", errdefs.ErrInvalid},
		{filepath.Join(dir, "proc") + dir, errdefs.ErrInvalid}, // through /proc/self/root
	} {
		if _, err := c.Watch(ctx, tt.path, false); !errors.Is(err, tt.kind) {
			t.Errorf("Watch %s: %v, want %v", tt.path, err, tt.kind)
		}
	}

	// A tree with more directories than a watch may cover is refused at the start...
	big := filepath.Join(dir, "big")
	for i := range 4 {
		os.MkdirAll(filepath.Join(big, fmt.Sprint(i)), 0o755)
	}
	if _, err := c.Watch(ctx, big, true); !errors.Is(err, errdefs.ErrExhausted) || !strings.Contains(err.Error(), "more than 4 directories") {
		t.Errorf("recursive watch of 5 directories with a limit of 4: %v", err)
	}
	if w, err := c.Watch(ctx, big, false); err != nil {
		t.Errorf("the same without recursive: %v", err)
	} else {
		w.Close()
	}
	// ...and one that grows past it ends with the same error.
	small := filepath.Join(dir, "small")
	os.MkdirAll(filepath.Join(small, "a"), 0o755)
	ws := startWatch(t, c, small, true)
	for i := range 3 {
		os.Mkdir(filepath.Join(small, fmt.Sprint("n", i)), 0o755)
	}
	if err := ws.end(); !errors.Is(err, errdefs.ErrExhausted) {
		t.Errorf("a watch whose tree grew past the limit ended with %v, want ErrExhausted", err)
	}

	// At most MaxWatches at once; closing one frees its place (once the agent has seen the
	// hang-up: the watches above are let go in the background).
	var open []*Watch
	defer func() {
		for _, w := range open {
			w.Close()
		}
	}()
	waitFor(t, "two watches open", 5*time.Second, func() bool {
		if w, err := c.Watch(ctx, dir, false); err == nil {
			open = append(open, w)
		}
		return len(open) == 2
	})
	if _, err := c.Watch(ctx, dir, false); !errors.Is(err, errdefs.ErrExhausted) || !strings.Contains(err.Error(), "2 watches") {
		t.Errorf("third watch with a limit of 2: %v", err)
	}
	open[0].Close()
	waitFor(t, "a closed watch to free its place", 5*time.Second, func() bool {
		w, err := c.Watch(ctx, dir, false)
		if err == nil {
			w.Close()
		}
		return err == nil
	})
}

// TestWatchOverflow: a client that does not read loses events, not the agent's memory; it is
// told with one overflow event, and events after it arrive again.
func TestWatchOverflow(t *testing.T) {
	c, _ := startServer(t, func(cfg *Config) { cfg.WatchQueue = 16 })
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := c.Watch(ctx, dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// Far more than the socket buffers hold, while nobody reads.
	const files = 8000
	long := strings.Repeat("n", 200)
	for i := range files {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprint(long, i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var creates, overflows int
	stop := make(chan struct{})
	defer close(stop)
	for {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("Next after %d creates, %d overflows: %v", creates, overflows, err)
		}
		switch {
		case ev.Type == WatchOverflow:
			overflows++
			if overflows == 1 {
				// Once the client reads again, changes arrive again. (What it reads now was
				// queued long ago, so the first markers may still be lost.)
				go func() {
					for i := 0; ; i++ {
						os.WriteFile(filepath.Join(dir, fmt.Sprint("marker", i)), nil, 0o644)
						select {
						case <-stop:
							return
						case <-time.After(20 * time.Millisecond):
						}
					}
				}()
			}
		case ev.Type == WatchCreate && strings.HasPrefix(ev.Name, "marker"):
			if creates >= files {
				t.Errorf("all %d creates arrived, and an overflow", creates)
			}
			t.Logf("%d of %d creates arrived, %d overflow events", creates, files, overflows)
			return
		case ev.Type == WatchCreate:
			creates++
		}
	}
}

func TestWatchQueue(t *testing.T) {
	q := newWatchQueue(3)
	at := time.Now()
	ev := func(typ, name string) WatchEvent { return WatchEvent{Type: typ, Name: name, At: at} }
	q.push(ev(WatchCreate, "a"))
	q.push(ev(WatchWrite, "a"))
	q.push(ev(WatchWrite, "a")) // folded into the one before
	q.push(ev(WatchWrite, "b"))
	q.push(ev(WatchWrite, "c")) // over the bound: dropped
	q.push(ev(WatchWrite, "d")) // dropped too, same overflow
	q.final(ev(WatchRemove, ""))
	got := q.take(nil)
	var types []string
	for _, e := range got {
		types = append(types, e.Type+":"+e.Name)
	}
	want := []string{"create:a", "write:a", "write:b", "overflow:", "remove:"}
	if !slices.Equal(types, want) {
		t.Errorf("queue gave %v, want %v", types, want)
	}
	if got := q.take(nil); len(got) != 0 {
		t.Errorf("second take gave %v", got)
	}
	q.push(ev(WatchWrite, "e"))
	if got := q.take(nil); len(got) != 1 || got[0].Name != "e" {
		t.Errorf("after the overflow: %v", got)
	}
}
