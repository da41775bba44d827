package corraltest

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// node is one file, directory or symlink of a sandbox's in-memory tree.
type node struct {
	dir   bool
	data  []byte
	link  string // symlink target; empty for other kinds
	mode  fs.FileMode
	mtime time.Time
	uid   int
	gid   int
}

func pathClean(p string) string { return path.Clean("/" + p) }

func (n *node) info(p string) corral.FileInfo {
	fi := corral.FileInfo{
		Name:    path.Base(p),
		Path:    p,
		Size:    int64(len(n.data)),
		Mode:    n.mode,
		ModTime: n.mtime,
		IsDir:   n.dir,
		Link:    n.link,
		UID:     n.uid,
		GID:     n.gid,
	}
	if n.dir {
		fi.Size = 0
	}
	return fi
}

// pathParam returns the clean absolute path of the request's "path" query parameter.
func pathParam(r *http.Request) (string, *httpError) {
	p := r.URL.Query().Get("path")
	if !strings.HasPrefix(p, "/") {
		return "", invalid("path", "path %q must be absolute", p)
	}
	return pathClean(p), nil
}

// parseMode parses an octal mode such as "0644" into fs.FileMode permission bits.
func parseMode(s string) (fs.FileMode, bool) {
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v > 0o7777 {
		return 0, false
	}
	m := fs.FileMode(v & 0o777)
	if v&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if v&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if v&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m, true
}

// mkdirAllLocked creates p and its missing parents.
//
// Preconditions: s.mu is held.
func mkdirAllLocked(sb *sandbox, p string, mode fs.FileMode) *httpError {
	if n, ok := sb.files[p]; ok {
		if !n.dir {
			return conflict("%s exists and is not a directory", p)
		}
		return nil
	}
	if err := mkdirAllLocked(sb, path.Dir(p), 0o755); err != nil {
		return err
	}
	sb.files[p] = &node{dir: true, mode: fs.ModeDir | mode.Perm(), mtime: timeNow()}
	sb.notifyLocked(corral.WatchCreate, p)
	return nil
}

// parentLocked checks that the parent of p is a directory, creating it when parents is set.
//
// Preconditions: s.mu is held.
func parentLocked(sb *sandbox, p string, parents bool) *httpError {
	dir := path.Dir(p)
	if parents {
		return mkdirAllLocked(sb, dir, 0o755)
	}
	n, ok := sb.files[dir]
	if !ok {
		return notFound("directory %s not found", dir)
	}
	if !n.dir {
		return conflict("%s is not a directory", dir)
	}
	return nil
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	p, herr := pathParam(r)
	if herr != nil {
		fail(w, herr)
		return
	}
	s.mu.Lock()
	sb, herr := s.runningLocked(r)
	var data []byte
	if herr == nil {
		n, ok := sb.files[p]
		switch {
		case !ok:
			herr = notFound("file %s not found", p)
		case n.dir:
			herr = invalid("path", "%s is a directory", p)
		default:
			data = n.data
		}
	}
	s.mu.Unlock()
	if herr != nil {
		fail(w, herr)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	_, _ = w.Write(data)
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) {
	p, herr := pathParam(r)
	if herr != nil {
		fail(w, herr)
		return
	}
	q := r.URL.Query()
	mode := fs.FileMode(0o644)
	if v := q.Get("mode"); v != "" {
		m, ok := parseMode(v)
		if !ok {
			fail(w, invalid("mode", "mode %q is not an octal file mode", v))
			return
		}
		mode = m
	}
	data, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, herr := s.runningLocked(r)
	if herr != nil {
		fail(w, herr)
		return
	}
	if herr := parentLocked(sb, p, q.Get("parents") == "true"); herr != nil {
		fail(w, herr)
		return
	}
	n, ok := sb.files[p]
	switch {
	case ok && n.dir:
		fail(w, conflict("%s is a directory", p))
		return
	case ok && q.Get("append") == "true":
		n.data = append(slices.Clip(n.data), data...)
	case ok:
		n.data = data
	default:
		n = &node{data: data, mode: mode}
		if q.Get("user") != "" && q.Get("user") != "root" {
			n.uid, n.gid = 1000, 1000
		}
		sb.files[p] = n
		sb.notifyLocked(corral.WatchCreate, p)
	}
	n.mtime = timeNow()
	sb.notifyLocked(corral.WatchWrite, p)
	writeJSON(w, http.StatusOK, n.info(p))
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request) {
	p, herr := pathParam(r)
	if herr != nil {
		fail(w, herr)
		return
	}
	recursive := r.URL.Query().Get("recursive") == "true"
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, herr := s.runningLocked(r)
	if herr != nil {
		fail(w, herr)
		return
	}
	n, ok := sb.files[p]
	if !ok {
		fail(w, notFound("file %s not found", p))
		return
	}
	if p == "/" {
		fail(w, invalid("path", "cannot remove /"))
		return
	}
	children := childrenLocked(sb, p, true)
	if n.dir && len(children) > 0 && !recursive {
		fail(w, conflict("directory %s is not empty", p))
		return
	}
	for _, c := range slices.Backward(children) {
		delete(sb.files, c)
		sb.notifyLocked(corral.WatchRemove, c)
	}
	delete(sb.files, p)
	sb.notifyLocked(corral.WatchRemove, p)
	w.WriteHeader(http.StatusNoContent)
}

// childrenLocked returns the sorted paths below dir: all descendants, or only direct entries.
//
// Preconditions: s.mu is held.
func childrenLocked(sb *sandbox, dir string, all bool) []string {
	prefix := strings.TrimSuffix(dir, "/") + "/"
	var out []string
	for p := range sb.files {
		if p == dir || !strings.HasPrefix(p, prefix) {
			continue
		}
		if all || !strings.Contains(p[len(prefix):], "/") {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

func (s *Server) stat(w http.ResponseWriter, r *http.Request) {
	p, herr := pathParam(r)
	if herr != nil {
		fail(w, herr)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, herr := s.runningLocked(r)
	if herr != nil {
		fail(w, herr)
		return
	}
	n, ok := sb.files[p]
	if !ok {
		fail(w, notFound("file %s not found", p))
		return
	}
	writeJSON(w, http.StatusOK, n.info(p))
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	p, herr := pathParam(r)
	if herr != nil {
		fail(w, herr)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, herr := s.runningLocked(r)
	if herr != nil {
		fail(w, herr)
		return
	}
	n, ok := sb.files[p]
	if !ok {
		fail(w, notFound("directory %s not found", p))
		return
	}
	if !n.dir {
		fail(w, invalid("path", "%s is not a directory", p))
		return
	}
	out := []corral.FileInfo{}
	for _, c := range childrenLocked(sb, p, false) {
		out = append(out, sb.files[c].info(c))
	}
	writeJSON(w, http.StatusOK, map[string]any{"files": out})
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) {
	var req corral.MkdirRequest
	if err := decodeBody(r, &req); err != nil {
		fail(w, err)
		return
	}
	if !strings.HasPrefix(req.Path, "/") {
		fail(w, invalid("path", "path %q must be absolute", req.Path))
		return
	}
	p := pathClean(req.Path)
	mode := req.Mode.Perm()
	if mode == 0 {
		mode = 0o755
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, herr := s.runningLocked(r)
	if herr != nil {
		fail(w, herr)
		return
	}
	if n, ok := sb.files[p]; ok {
		if n.dir && req.Parents {
			writeJSON(w, http.StatusOK, n.info(p))
			return
		}
		fail(w, conflict("%s already exists", p))
		return
	}
	if herr := parentLocked(sb, p, req.Parents); herr != nil {
		fail(w, herr)
		return
	}
	n := &node{dir: true, mode: fs.ModeDir | mode, mtime: timeNow()}
	sb.files[p] = n
	sb.notifyLocked(corral.WatchCreate, p)
	writeJSON(w, http.StatusOK, n.info(p))
}

// tarOut writes the tree at path as a tar stream whose names are relative to path; a regular
// file yields a one-entry tar named after its base name.
func (s *Server) tarOut(w http.ResponseWriter, r *http.Request) {
	p, herr := pathParam(r)
	if herr != nil {
		fail(w, herr)
		return
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	s.mu.Lock()
	sb, herr := s.runningLocked(r)
	if herr == nil {
		herr = writeTarLocked(tw, sb, p)
	}
	s.mu.Unlock()
	if herr != nil {
		fail(w, herr)
		return
	}
	if err := tw.Close(); err != nil {
		fail(w, &httpError{http.StatusInternalServerError, corral.CodeInternal, err.Error(), ""})
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	_, _ = w.Write(buf.Bytes())
}

// writeTarLocked writes the tree at p to tw.
//
// Preconditions: s.mu is held.
func writeTarLocked(tw *tar.Writer, sb *sandbox, p string) *httpError {
	root, ok := sb.files[p]
	if !ok {
		return notFound("file %s not found", p)
	}
	entries := []string{p}
	base := path.Dir(p)
	if root.dir {
		entries = childrenLocked(sb, p, true)
		base = p
	}
	for _, e := range entries {
		n := sb.files[e]
		name := strings.TrimPrefix(strings.TrimPrefix(e, base), "/")
		hdr := &tar.Header{Name: name, Mode: int64(n.mode.Perm()), ModTime: n.mtime, Uid: n.uid, Gid: n.gid}
		switch {
		case n.dir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
		case n.link != "":
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, n.link
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(n.data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return &httpError{http.StatusInternalServerError, corral.CodeInternal, err.Error(), ""}
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(n.data); err != nil {
				return &httpError{http.StatusInternalServerError, corral.CodeInternal, err.Error(), ""}
			}
		}
	}
	return nil
}

// tarIn extracts a tar stream into the existing directory at path. Entries that would land
// outside it are rejected, as the real server must.
func (s *Server) tarIn(w http.ResponseWriter, r *http.Request) {
	dir, herr := pathParam(r)
	if herr != nil {
		fail(w, herr)
		return
	}
	type entry struct {
		path string
		n    *node
	}
	var entries []entry
	tr := tar.NewReader(r.Body)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			fail(w, invalid("", "read tar: %v", err))
			return
		}
		name := path.Clean(hdr.Name)
		if path.IsAbs(hdr.Name) || name == ".." || strings.HasPrefix(name, "../") {
			fail(w, invalid("", "tar entry %q leaves the target directory", hdr.Name))
			return
		}
		if name == "." {
			continue
		}
		n := &node{mode: fs.FileMode(hdr.Mode).Perm(), mtime: timeNow(), uid: hdr.Uid, gid: hdr.Gid}
		switch hdr.Typeflag {
		case tar.TypeDir:
			n.dir, n.mode = true, n.mode|fs.ModeDir
		case tar.TypeReg:
			if n.data, err = io.ReadAll(tr); err != nil {
				fail(w, invalid("", "read tar: %v", err))
				return
			}
		case tar.TypeSymlink:
			n.link, n.mode = hdr.Linkname, n.mode|fs.ModeSymlink
		default:
			continue
		}
		entries = append(entries, entry{path.Join(dir, name), n})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, herr := s.runningLocked(r)
	if herr != nil {
		fail(w, herr)
		return
	}
	if d, ok := sb.files[dir]; !ok || !d.dir {
		fail(w, notFound("directory %s not found", dir))
		return
	}
	for _, e := range entries {
		if e.n.dir {
			if herr := mkdirAllLocked(sb, e.path, e.n.mode); herr != nil {
				fail(w, herr)
				return
			}
			continue
		}
		if herr := mkdirAllLocked(sb, path.Dir(e.path), 0o755); herr != nil {
			fail(w, herr)
			return
		}
		_, existed := sb.files[e.path]
		sb.files[e.path] = e.n
		if !existed {
			sb.notifyLocked(corral.WatchCreate, e.path)
		}
		sb.notifyLocked(corral.WatchWrite, e.path)
	}
	w.WriteHeader(http.StatusNoContent)
}

// move renames a file or directory (and everything below it) as rename(2) would.
func (s *Server) move(w http.ResponseWriter, r *http.Request) {
	var req corral.MoveRequest
	if err := decodeBody(r, &req); err != nil {
		fail(w, err)
		return
	}
	for _, f := range []struct{ name, p string }{{"source", req.Source}, {"destination", req.Destination}} {
		if !strings.HasPrefix(f.p, "/") {
			fail(w, invalid(f.name, "%q must be an absolute path", f.p))
			return
		}
	}
	src, dst := pathClean(req.Source), pathClean(req.Destination)
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, herr := s.runningLocked(r)
	if herr != nil {
		fail(w, herr)
		return
	}
	n, ok := sb.files[src]
	switch {
	case src == "/" || dst == "/":
		herr = invalid("source", "refusing to move or replace /")
	case !ok:
		herr = notFound("move %s: no such file or directory", src)
	case strings.HasPrefix(dst, src+"/"):
		herr = invalid("destination", "%s is inside %s: a directory cannot be moved into itself", dst, src)
	}
	if herr == nil {
		if parent, ok := sb.files[path.Dir(dst)]; !ok || !parent.dir {
			herr = notFound("move to %s: parent directory %s does not exist (create it first)", dst, path.Dir(dst))
		}
	}
	if old, ok := sb.files[dst]; herr == nil && ok && dst != src {
		switch {
		case old.dir && !n.dir:
			herr = conflict("move %s to %s: the destination is a directory and the source is not", src, dst)
		case !old.dir && n.dir:
			herr = conflict("move %s to %s: the source is a directory and the destination is not", src, dst)
		case old.dir && len(childrenLocked(sb, dst, false)) > 0:
			herr = conflict("move %s to %s: the destination is a directory that is not empty", src, dst)
		}
	}
	if herr != nil {
		fail(w, herr)
		return
	}
	if dst != src {
		for _, c := range childrenLocked(sb, src, true) {
			sb.files[dst+strings.TrimPrefix(c, src)] = sb.files[c]
			delete(sb.files, c)
		}
		sb.files[dst] = n
		delete(sb.files, src)
		sb.notifyLocked(corral.WatchRename, src)
		sb.notifyLocked(corral.WatchRename, dst)
	}
	writeJSON(w, http.StatusOK, n.info(dst))
}

// maxWatches is how many watches a fake sandbox allows at once, as the real server does.
const maxWatches = 8

// fakeWatch is one open watch of a sandbox's tree. It sees the changes made through the API
// (writes, mkdir, remove, move, tar uploads), not those of fake programs.
type fakeWatch struct {
	dir       string
	recursive bool
	events    chan corral.WatchEvent // buffered; full means the client reads slowly
	// Protected by Server.mu:
	dropped bool   // events were lost since the last overflow event
	gone    string // the event that ended the watch (the directory removed or moved), or ""
	done    chan struct{}
}

// notifyLocked reports a change of p to the sandbox's watches.
//
// Preconditions: s.mu is held.
func (sb *sandbox) notifyLocked(typ, p string) {
	for _, fw := range sb.watchers {
		if fw.gone != "" {
			continue
		}
		if p == fw.dir {
			if typ == corral.WatchRemove || typ == corral.WatchRename {
				fw.gone = typ
				close(fw.done)
			}
			continue
		}
		rel, ok := strings.CutPrefix(p, strings.TrimSuffix(fw.dir, "/")+"/")
		if !ok || (!fw.recursive && strings.Contains(rel, "/")) {
			continue
		}
		select {
		case fw.events <- corral.WatchEvent{Type: typ, Name: rel, At: timeNow()}:
		default:
			fw.dropped = true
		}
	}
}

// watch streams the changes of a directory made through the API, as NDJSON.
func (s *Server) watch(w http.ResponseWriter, r *http.Request) {
	p, herr := pathParam(r)
	if herr != nil {
		fail(w, herr)
		return
	}
	s.mu.Lock()
	sb, herr := s.runningLocked(r)
	if herr == nil {
		n, ok := sb.files[p]
		switch {
		case !ok:
			herr = notFound("watch %s: no such directory", p)
		case !n.dir:
			herr = invalid("path", "%s is not a directory", p)
		case len(sb.watchers) >= maxWatches:
			herr = &httpError{http.StatusTooManyRequests, corral.CodeExhausted,
				fmt.Sprintf("watch %s: %d watches are open in this sandbox, the most it allows; close one first", p, maxWatches), ""}
		}
	}
	var fw *fakeWatch
	if herr == nil {
		fw = &fakeWatch{dir: p, recursive: r.URL.Query().Get("recursive") == "true",
			events: make(chan corral.WatchEvent, 256), done: make(chan struct{})}
		sb.watchers = append(sb.watchers, fw)
	}
	s.mu.Unlock()
	if herr != nil {
		fail(w, herr)
		return
	}
	defer func() {
		s.mu.Lock()
		sb.watchers = slices.DeleteFunc(sb.watchers, func(o *fakeWatch) bool { return o == fw })
		s.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	rc := http.NewResponseController(w)
	send := func(ev corral.WatchEvent) bool {
		return enc.Encode(ev) == nil && rc.Flush() == nil
	}
	if !send(corral.WatchEvent{Type: corral.WatchStart}) {
		return
	}
	for {
		select {
		case ev := <-fw.events:
			if !send(ev) {
				return
			}
			s.mu.Lock()
			overflow := fw.dropped && len(fw.events) == 0
			if overflow {
				fw.dropped = false
			}
			s.mu.Unlock()
			if overflow && !send(corral.WatchEvent{Type: corral.WatchOverflow, At: timeNow()}) {
				return
			}
		case <-fw.done:
			for len(fw.events) > 0 {
				if !send(<-fw.events) {
					return
				}
			}
			s.mu.Lock()
			gone := fw.gone
			s.mu.Unlock()
			send(corral.WatchEvent{Type: gone, At: timeNow()})
			return
		case <-sb.ctx.Done():
			enc.Encode(map[string]string{"type": corral.EventError, "code": corral.CodeUnavailable, "message": "sandbox " + sb.spec.ID + " stopped"})
			return
		case <-r.Context().Done():
			return
		}
	}
}
