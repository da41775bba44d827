package e2b

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// envd's filesystem.Filesystem service (docs/e2b-protocol.md §6) on Corral's file API: Stat,
// ListDir, MakeDir, Move, Remove, the WatchDir stream, and the polling watchers
// (CreateWatcher, GetWatcherEvents, RemoveWatcher) that the Python SDK's synchronous
// watch_dir uses.
//
// Users and paths. The request's user (HTTP Basic user name; the username query parameter on
// /files) decides two things, as in envd: the home that relative paths, "" and "~" resolve
// against, and the owner of what the call creates. No user means Corral's default user, root.
// Homes come from the sandbox's /etc/passwd, read with Corral's ReadFile and cached per sandbox
// for userTTL (at most maxUserTables sandboxes). A user not in the cached table makes it read
// again, so a user added a moment ago is found; a write, move or remove under /etc through this
// gateway drops the sandbox's table. Root without a passwd entry has the home /root. A user the
// sandbox does not have is refused as envd refuses it (unauthenticated, "invalid username").
// The same tables, with /etc/group, name owners and groups in EntryInfo (the number when
// unknown). Corral's file API acts as root whatever the user, so permissions are not checked
// per user; only ownership of created files and directories follows the user.
//
// Differences from envd, all deliberate:
//   - ListDir with depth > 1 walks the tree with one Corral List per directory and stops with
//     resource_exhausted past maxListEntries entries (envd has no bound). Symbolic links are
//     listed, not followed, as envd's walk does.
//   - Stat describes a symbolic link itself (FILE_TYPE_SYMLINK, symlinkTarget), as Corral's
//     stat does; envd's follows it. Mode is the permission bits, permissions Go's rendering of
//     the mode ("-rw-r--r--", "drwxr-xr-x"), as envd's are.
//   - MakeDir answers the full EntryInfo of the new directory (envd: name, type and path).
//   - WatchDir sends start once Corral's watch is in place, then one filesystem event per
//     Corral event (Corral reports one kind per event, where inotify may combine several),
//     named relative to the directory ("." for the directory itself), and keepalive after
//     Keepalive-Ping-Interval without a message. It ends cleanly after the directory itself is
//     removed or moved away (envd keeps such a stream open, silent), with deadline_exceeded at
//     the client's Connect-Timeout-Ms, with Corral's error when Corral ends the watch (the
//     sandbox stopped: unavailable), and, as envd's does when inotify overflows, with an
//     internal error when Corral reports lost events ("overflow"): the client learns that its
//     view is incomplete and can list and watch again.
//   - include_entry on watches is served by a Stat per event (no entry once the file is gone);
//     EntryInfo.metadata (extended attributes) is never filled.
//   - Polling watchers live in this gateway's memory: at most maxWatchers, each holding at most
//     maxWatcherEvents events between polls (past that the watch ends with resource_exhausted),
//     dropped with their Corral watch after watcherIdle without a poll. A poll that reaches
//     another gateway process finds no watcher (not_found). GetWatcherEvents returns the events
//     before an error first, then the error (envd: the error at once).

// File types and event types of envd's filesystem protocol, as proto3 JSON names them.
const (
	fileTypeFile      = "FILE_TYPE_FILE"
	fileTypeDirectory = "FILE_TYPE_DIRECTORY"
	fileTypeSymlink   = "FILE_TYPE_SYMLINK"
)

// eventTypes maps the types of Corral's watch events onto envd's EventType names.
var eventTypes = map[string]string{
	corral.WatchCreate: "EVENT_TYPE_CREATE",
	corral.WatchWrite:  "EVENT_TYPE_WRITE",
	corral.WatchRemove: "EVENT_TYPE_REMOVE",
	corral.WatchRename: "EVENT_TYPE_RENAME",
	corral.WatchChmod:  "EVENT_TYPE_CHMOD",
}

// Bounds of the filesystem surface.
const (
	// maxListEntries bounds a ListDir with depth > 1.
	maxListEntries = 10_000
	// maxUserDBFile bounds how much of /etc/passwd or /etc/group is read (the sandbox's root
	// can write them: they are untrusted input).
	maxUserDBFile = 4 << 20
	// userTTL is how long a sandbox's users are cached.
	userTTL = 30 * time.Second
	// maxUserTables bounds the sandboxes whose users are cached.
	maxUserTables = 1024
	// maxWatchers bounds the polling watchers of a gateway.
	maxWatchers = 256
	// maxWatcherEvents bounds the events a polling watcher holds between two polls.
	maxWatcherEvents = 10_000
)

// watcherIdle is how long a polling watcher lives without a poll (a variable for tests).
var watcherIdle = 10 * time.Minute

// entryInfo is envd's EntryInfo in proto3 JSON: zero values left out, int64 as a string,
// the time in RFC 3339.
type entryInfo struct {
	Name          string  `json:"name,omitempty"`
	Type          string  `json:"type,omitempty"`
	Path          string  `json:"path,omitempty"`
	Size          int64   `json:"size,omitempty,string"`
	Mode          uint32  `json:"mode,omitempty"`
	Permissions   string  `json:"permissions,omitempty"`
	Owner         string  `json:"owner,omitempty"`
	Group         string  `json:"group,omitempty"`
	ModifiedTime  string  `json:"modifiedTime,omitempty"`
	SymlinkTarget *string `json:"symlinkTarget,omitempty"`
}

// pbUint32 is a proto3 JSON uint32, which may arrive as a number or a string.
type pbUint32 uint32

// UnmarshalJSON accepts 3 and "3".
func (n *pbUint32) UnmarshalJSON(b []byte) error {
	s := string(bytes.Trim(b, `"`))
	if s == "null" {
		return nil
	}
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return fmt.Errorf("%s is not a uint32", b)
	}
	*n = pbUint32(v)
	return nil
}

// Messages of the filesystem service. Names with two words are accepted in both spellings
// proto3 JSON allows (lowerCamelCase and the proto name).
type (
	pathRequest struct {
		Path string `json:"path"`
	}
	listDirRequest struct {
		Path  string   `json:"path"`
		Depth pbUint32 `json:"depth"`
	}
	moveRequest struct {
		Source      string `json:"source"`
		Destination string `json:"destination"`
	}
	watchRequest struct {
		Path              string `json:"path"`
		Recursive         bool   `json:"recursive"`
		IncludeEntry      bool   `json:"includeEntry"`
		IncludeEntrySnake bool   `json:"include_entry"`
		// allowNetworkMounts / allow_network_mounts are accepted and moot: a Corral sandbox
		// has no network mounts to refuse.
	}
	watcherRequest struct {
		WatcherID      string `json:"watcherId"`
		WatcherIDSnake string `json:"watcher_id"`
	}
	entryResponse struct {
		Entry *entryInfo `json:"entry,omitempty"`
	}
	listDirResponse struct {
		Entries []entryInfo `json:"entries"`
	}
	fsEvent struct {
		Name  string     `json:"name"`
		Type  string     `json:"type"`
		Entry *entryInfo `json:"entry,omitempty"`
	}
	watchDirResponse struct {
		Start      *struct{} `json:"start,omitempty"`
		Filesystem *fsEvent  `json:"filesystem,omitempty"`
		Keepalive  *struct{} `json:"keepalive,omitempty"`
	}
	createWatcherResponse struct {
		WatcherID string `json:"watcherId"`
	}
	watcherEventsResponse struct {
		Events []fsEvent `json:"events"`
	}
)

func (r watchRequest) includeEntry() bool { return r.IncludeEntry || r.IncludeEntrySnake }

func (r watcherRequest) id() string {
	if r.WatcherID != "" {
		return r.WatcherID
	}
	return r.WatcherIDSnake
}

// filesystemMethod returns the handler of a method of envd's filesystem.Filesystem service.
func (g *Gateway) filesystemMethod(name string) envdHandler {
	switch name {
	case "Stat":
		return fsUnary(g, g.fsStat)
	case "ListDir":
		return fsUnary(g, g.fsListDir)
	case "MakeDir":
		return fsUnary(g, g.fsMakeDir)
	case "Move":
		return fsUnary(g, g.fsMove)
	case "Remove":
		return fsUnary(g, g.fsRemove)
	case "WatchDir":
		return g.fsWatchDir
	case "CreateWatcher":
		return fsUnary(g, g.fsCreateWatcher)
	case "GetWatcherEvents":
		return fsUnary(g, g.fsGetWatcherEvents)
	case "RemoveWatcher":
		return fsUnary(g, g.fsRemoveWatcher)
	}
	return func(w http.ResponseWriter, r *http.Request, t *sandboxTarget) {
		writeUnary(w, nil, rpcErrorf(codeUnimplemented, "filesystem.Filesystem/%s is not a method of envd's filesystem service", name))
	}
}

// fsUnary adapts a unary method: it decodes the request, finds the caller's user, and answers
// with the method's result or error.
func fsUnary[Req, Resp any](g *Gateway, fn func(ctx context.Context, c *fsCall, req *Req) (*Resp, error)) envdHandler {
	return func(w http.ResponseWriter, r *http.Request, t *sandboxTarget) {
		var req Req
		if err := readUnary(r, &req); err != nil {
			writeUnary(w, nil, err)
			return
		}
		c, err := g.fsCallFor(r.Context(), t, t.user)
		if err != nil {
			writeUnary(w, nil, err)
			return
		}
		resp, err := fn(r.Context(), c, &req)
		writeUnary(w, resp, err)
	}
}

// fsCall is one request of the filesystem surface with its user resolved.
type fsCall struct {
	t     *sandboxTarget
	users *userTable
	// home is the home of the request's user.
	home string
	// owner is the user Corral makes created files and directories belong to ("": Corral's
	// default, root).
	owner string
}

// fsCallFor resolves user (empty: Corral's default user, root) in the sandbox of t.
func (g *Gateway) fsCallFor(ctx context.Context, t *sandboxTarget, user string) (*fsCall, error) {
	st := g.fsState()
	tab, err := st.userTable(ctx, t, false)
	if err != nil {
		return nil, err
	}
	home, ok := tab.home(user)
	if !ok {
		if tab, err = st.userTable(ctx, t, true); err != nil {
			return nil, err
		}
		if home, ok = tab.home(user); !ok {
			return nil, rpcErrorf(codeUnauthenticated, "invalid username %q: no such user in /etc/passwd of sandbox %s", user, t.id)
		}
	}
	return &fsCall{t: t, users: tab, home: home, owner: user}, nil
}

// abs resolves a path of the request as envd does: "" is the home, "~" and "~/..." are in it,
// a relative path is relative to it; "~user" is refused. The result is clean and absolute.
func (c *fsCall) abs(p string) (string, error) {
	switch {
	case p == "" || p == "~":
		return c.home, nil
	case strings.HasPrefix(p, "~/"):
		return path.Join(c.home, p[2:]), nil
	case strings.HasPrefix(p, "~"):
		return "", rpcErrorf(codeInvalidArgument, "path %q: cannot expand another user's home directory", p)
	case strings.ContainsRune(p, 0):
		return "", rpcErrorf(codeInvalidArgument, "path %q contains a NUL byte", p)
	case path.IsAbs(p):
		return path.Clean(p), nil
	}
	return path.Join(c.home, p), nil
}

// entry converts Corral's description of a file into envd's.
func (c *fsCall) entry(fi *corral.FileInfo) *entryInfo {
	e := &entryInfo{
		Name:         fi.Name,
		Path:         fi.Path,
		Size:         fi.Size,
		Mode:         uint32(fi.Mode.Perm()),
		Permissions:  fi.Mode.String(),
		Owner:        c.users.userName(fi.UID),
		Group:        c.users.groupName(fi.GID),
		ModifiedTime: protoTime(fi.ModTime),
	}
	switch {
	case fi.IsDir || fi.Mode.IsDir():
		e.Type = fileTypeDirectory
	case fi.Mode&fs.ModeSymlink != 0 || fi.Link != "":
		e.Type = fileTypeSymlink
	case fi.Mode.IsRegular():
		e.Type = fileTypeFile
	}
	if fi.Link != "" {
		link := fi.Link
		e.SymlinkTarget = &link
	}
	if e.Name == "" {
		e.Name = path.Base(fi.Path)
	}
	return e
}

// protoTime formats t as proto3 JSON formats a Timestamp: UTC, with 0, 3, 6 or 9 fractional
// digits (the SDK's parser accepts no other count). The zero time is "".
func protoTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	t = t.UTC()
	switch ns := t.Nanosecond(); {
	case ns == 0:
		return t.Format("2006-01-02T15:04:05Z")
	case ns%1e6 == 0:
		return t.Format("2006-01-02T15:04:05.000Z")
	case ns%1e3 == 0:
		return t.Format("2006-01-02T15:04:05.000000Z")
	}
	return t.Format("2006-01-02T15:04:05.000000000Z")
}

// fsError maps an error of Corral's file API onto a Connect error; what names the operation
// for the message.
func fsError(err error, what string) error {
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*rpcError](err); ok {
		return err
	}
	if ce, ok := errors.AsType[*corral.APIError](err); ok {
		code, _ := connectCode(ce)
		return rpcErrorf(code, "%s: %s", what, ce.Error())
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return rpcErrorf(codeDeadlineExceeded, "%s: deadline exceeded", what)
	case errors.Is(err, context.Canceled):
		return rpcErrorf(codeCanceled, "%s: canceled", what)
	}
	return rpcErrorf(codeUnavailable, "%s: Corral did not answer: %v", what, err)
}

func (g *Gateway) fsStat(ctx context.Context, c *fsCall, req *pathRequest) (*entryResponse, error) {
	p, err := c.abs(req.Path)
	if err != nil {
		return nil, err
	}
	fi, err := c.t.c.Stat(ctx, c.t.id, p)
	if err != nil {
		return nil, fsError(err, "stat "+p)
	}
	return &entryResponse{Entry: c.entry(fi)}, nil
}

func (g *Gateway) fsListDir(ctx context.Context, c *fsCall, req *listDirRequest) (*listDirResponse, error) {
	p, err := c.abs(req.Path)
	if err != nil {
		return nil, err
	}
	depth := int(req.Depth)
	if depth == 0 {
		depth = 1 // envd's default
	}
	out := &listDirResponse{Entries: []entryInfo{}}
	if err := c.walk(ctx, p, depth, depth > 1, &out.Entries); err != nil {
		return nil, err
	}
	return out, nil
}

// walk appends the entries of dir, and of its subdirectories down to depth levels, in the
// order of envd's walk: by name, each directory followed by its contents. Symbolic links are
// not followed. bounded stops the walk past maxListEntries entries.
func (c *fsCall) walk(ctx context.Context, dir string, depth int, bounded bool, out *[]entryInfo) error {
	files, err := c.t.c.List(ctx, c.t.id, dir)
	if err != nil {
		return fsError(err, "list "+dir)
	}
	slices.SortFunc(files, func(a, b corral.FileInfo) int { return strings.Compare(a.Name, b.Name) })
	for i := range files {
		if bounded && len(*out) >= maxListEntries {
			return rpcErrorf(codeResourceExhaust, "list %s: more than %d entries at this depth; list with a smaller depth or a deeper path", dir, maxListEntries)
		}
		e := c.entry(&files[i])
		*out = append(*out, *e)
		if depth > 1 && e.Type == fileTypeDirectory {
			if err := c.walk(ctx, files[i].Path, depth-1, bounded, out); err != nil {
				return err
			}
		}
	}
	return nil
}

func (g *Gateway) fsMakeDir(ctx context.Context, c *fsCall, req *pathRequest) (*entryResponse, error) {
	p, err := c.abs(req.Path)
	if err != nil {
		return nil, err
	}
	// envd: an existing directory is already_exists (the SDK's makeDir then returns false), an
	// existing file invalid_argument; missing parents are created.
	switch fi, err := c.t.c.Stat(ctx, c.t.id, p); {
	case err == nil && fi.IsDir:
		return nil, rpcErrorf(codeAlreadyExists, "directory already exists: %s", p)
	case err == nil:
		return nil, rpcErrorf(codeInvalidArgument, "path already exists but it is not a directory: %s", p)
	case !corral.IsNotFound(err):
		return nil, fsError(err, "stat "+p)
	}
	fi, err := c.t.c.Mkdir(ctx, c.t.id, corral.MkdirRequest{Path: p, Parents: true, User: c.owner})
	if err != nil {
		return nil, fsError(err, "make directory "+p)
	}
	return &entryResponse{Entry: c.entry(fi)}, nil
}

func (g *Gateway) fsRemove(ctx context.Context, c *fsCall, req *pathRequest) (*struct{}, error) {
	p, err := c.abs(req.Path)
	if err != nil {
		return nil, err
	}
	// envd removes with os.RemoveAll: recursive, and a missing path is no error.
	if err := c.t.c.Remove(ctx, c.t.id, p, true); err != nil && !corral.IsNotFound(err) {
		return nil, fsError(err, "remove "+p)
	}
	g.fsState().touched(c.t.id, p)
	return &struct{}{}, nil
}

// fsState returns what the filesystem surface of g keeps between requests.
func (g *Gateway) fsState() *fsState { return g.fs }

// fsState is the memory of the filesystem surface: users per sandbox and polling watchers.
//
// Lock order: fsState.mu before pollWatcher.mu. No I/O happens under either.
type fsState struct {
	mu sync.Mutex
	// The fields below are protected by mu.
	users    map[string]*userTable   // by sandbox ID
	watchers map[string]*pollWatcher // by watcher ID
}

func newFSState() *fsState {
	return &fsState{users: map[string]*userTable{}, watchers: map[string]*pollWatcher{}}
}

// userTable is what a sandbox's /etc/passwd and /etc/group say. It is immutable once built.
type userTable struct {
	loaded time.Time
	homes  map[string]string // user name -> home
	uids   map[int]string    // uid -> first user name with it
	rootHm string            // home of uid 0
	gids   map[int]string    // gid -> group name
}

// home returns the home of user ("": Corral's default user, root).
func (u *userTable) home(user string) (string, bool) {
	if user == "" {
		return u.rootHm, true
	}
	if h, ok := u.homes[user]; ok {
		return h, true
	}
	if user == "root" { // a sandbox without /etc/passwd
		return u.rootHm, true
	}
	// A numeric uid that has a passwd entry.
	if uid, err := strconv.Atoi(user); err == nil {
		if name, ok := u.uids[uid]; ok {
			return u.homes[name], true
		}
	}
	return "", false
}

func (u *userTable) userName(uid int) string {
	if n, ok := u.uids[uid]; ok {
		return n
	}
	if uid == 0 {
		return "root"
	}
	return strconv.Itoa(uid)
}

func (u *userTable) groupName(gid int) string {
	if n, ok := u.gids[gid]; ok {
		return n
	}
	if gid == 0 {
		return "root"
	}
	return strconv.Itoa(gid)
}

// userTable returns the cached users of t's sandbox, reading them again when they are older
// than userTTL or fresh is set.
func (s *fsState) userTable(ctx context.Context, t *sandboxTarget, fresh bool) (*userTable, error) {
	s.mu.Lock()
	tab, ok := s.users[t.id]
	s.mu.Unlock()
	if ok {
		if !fresh && time.Since(tab.loaded) < userTTL {
			return tab, nil
		}
	}
	tab, err := loadUsers(ctx, t)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.users[t.id]; !ok && len(s.users) >= maxUserTables {
		var oldest string
		for id, u := range s.users {
			if oldest == "" || u.loaded.Before(s.users[oldest].loaded) {
				oldest = id
			}
		}
		delete(s.users, oldest)
	}
	s.users[t.id] = tab
	return tab, nil
}

// touched forgets the users of a sandbox when p may have changed its /etc/passwd or /etc/group.
func (s *fsState) touched(sandboxID, p string) {
	if p == "/" || p == "/etc" || strings.HasPrefix(p, "/etc/") {
		s.mu.Lock()
		delete(s.users, sandboxID)
		s.mu.Unlock()
	}
}

// loadUsers reads the sandbox's /etc/passwd and /etc/group. Missing files leave root alone.
func loadUsers(ctx context.Context, t *sandboxTarget) (*userTable, error) {
	tab := &userTable{loaded: time.Now(), homes: map[string]string{}, uids: map[int]string{}, rootHm: "/root", gids: map[int]string{}}
	err := readColonFile(ctx, t, "/etc/passwd", func(f []string) {
		// name:password:uid:gid:gecos:home:shell
		if len(f) < 6 || f[0] == "" {
			return
		}
		uid, err := strconv.Atoi(f[2])
		if err != nil {
			return
		}
		home := f[5]
		if !path.IsAbs(home) {
			home = "/"
		}
		home = path.Clean(home)
		if _, dup := tab.homes[f[0]]; !dup {
			tab.homes[f[0]] = home
		}
		if _, dup := tab.uids[uid]; !dup {
			tab.uids[uid] = f[0]
			if uid == 0 {
				tab.rootHm = home
			}
		}
	})
	if err != nil {
		return nil, err
	}
	err = readColonFile(ctx, t, "/etc/group", func(f []string) {
		// name:password:gid:members
		if len(f) < 3 || f[0] == "" {
			return
		}
		if gid, err := strconv.Atoi(f[2]); err == nil {
			if _, dup := tab.gids[gid]; !dup {
				tab.gids[gid] = f[0]
			}
		}
	})
	if err != nil {
		return nil, err
	}
	return tab, nil
}

// readColonFile calls line with the ':'-separated fields of each line of a sandbox file, at
// most maxUserDBFile bytes of it. A missing file has no lines.
func readColonFile(ctx context.Context, t *sandboxTarget, p string, line func([]string)) error {
	rc, err := t.c.ReadFile(ctx, t.id, p)
	if err != nil {
		if corral.IsNotFound(err) {
			return nil
		}
		return fsError(err, "read "+p+" (to find the request's user)")
	}
	defer rc.Close()
	sc := bufio.NewScanner(io.LimitReader(rc, maxUserDBFile))
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == '#' {
			continue
		}
		line(strings.Split(l, ":"))
	}
	if err := sc.Err(); err != nil {
		return rpcErrorf(codeInternal, "read %s of sandbox %s: %v", p, t.id, err)
	}
	return nil
}

// newWatcherID returns an unguessable watcher ID ("w" and 32 hex digits, as envd's start with
// "w").
func newWatcherID() string {
	var b [16]byte
	rand.Read(b[:])
	return "w" + hex.EncodeToString(b[:])
}

func (g *Gateway) fsMove(ctx context.Context, c *fsCall, req *moveRequest) (*entryResponse, error) {
	src, err := c.abs(req.Source)
	if err != nil {
		return nil, err
	}
	dst, err := c.abs(req.Destination)
	if err != nil {
		return nil, err
	}
	// envd creates the destination's missing parents, owned by the user, then renames.
	if dir := path.Dir(dst); dir != "/" {
		if _, err := c.t.c.Mkdir(ctx, c.t.id, corral.MkdirRequest{Path: dir, Parents: true, User: c.owner}); err != nil {
			return nil, fsError(err, "make directory "+dir)
		}
	}
	fi, err := c.t.c.Move(ctx, c.t.id, src, dst)
	g.fsState().touched(c.t.id, src)
	g.fsState().touched(c.t.id, dst)
	if err != nil {
		return nil, fsError(err, "move "+src+" to "+dst)
	}
	return &entryResponse{Entry: c.entry(fi)}, nil
}

// watch is an armed watch of a directory: Corral's event stream after its start event.
type watch struct {
	c     *fsCall
	dir   string
	entry bool // attach an EntryInfo to each event
	ws    *corral.WatchStream
}

// startWatch checks dir (envd: missing is not_found, not a directory invalid_argument) and
// arms a Corral watch of it, returning once Corral says the watch is in place (its start
// event, which the SDK reads).
func (c *fsCall) startWatch(ctx context.Context, p string, recursive, entry bool) (*watch, error) {
	dir, err := c.abs(p)
	if err != nil {
		return nil, err
	}
	fi, err := c.t.c.Stat(ctx, c.t.id, dir)
	if err != nil {
		return nil, fsError(err, "watch "+dir)
	}
	if !fi.IsDir {
		return nil, rpcErrorf(codeInvalidArgument, "path %s not a directory", dir)
	}
	ws, err := c.t.c.Watch(ctx, c.t.id, dir, recursive)
	if err != nil {
		return nil, fsError(err, "watch "+dir)
	}
	return &watch{c: c, dir: dir, entry: entry, ws: ws}, nil
}

// next returns the next event to pass on, or what ends the watch: io.EOF when the watched
// directory went away (its remove or rename was the last event), Corral's error, or an
// internal error when Corral lost events.
func (w *watch) next(ctx context.Context) (fsEvent, error) {
	for {
		ev, err := w.ws.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return fsEvent{}, io.EOF // the watched directory went away
			}
			return fsEvent{}, fsError(err, "watch "+w.dir)
		}
		if ev.Type == corral.WatchOverflow {
			return fsEvent{}, rpcErrorf(codeInternal, "watch %s: events were lost (too many at once); list the directory and watch it again", w.dir)
		}
		typ, ok := eventTypes[ev.Type]
		if !ok {
			continue // start, or a type this gateway does not know
		}
		if ev.Name == "" {
			ev.Name = "." // the watched directory itself, as envd names it
		}
		e := fsEvent{Name: ev.Name, Type: typ}
		if w.entry {
			if fi, err := w.c.t.c.Stat(ctx, w.c.t.id, path.Join(w.dir, ev.Name)); err == nil {
				e.Entry = w.c.entry(fi)
			}
		}
		return e, nil
	}
}

// fsWatchDir serves the WatchDir stream: start once Corral's watch is armed, then one
// filesystem event per Corral event, keepalive after Keepalive-Ping-Interval without one; it
// ends at the client's Connect-Timeout-Ms (deadline_exceeded), when the client goes away, or
// with the error that ends Corral's watch.
func (g *Gateway) fsWatchDir(w http.ResponseWriter, r *http.Request, t *sandboxTarget) {
	if err := checkContentType(r, "application/connect+json"); err != nil {
		writeUnary(w, nil, err) // not a stream the client can read
		return
	}
	// sctx is the stream's life: the request's, up to the client's deadline. Errors are judged
	// against it (watchEndError), not against ctx below, which ends after it.
	sctx := r.Context()
	if d := streamTimeout(r); d > 0 {
		var cancel context.CancelFunc
		sctx, cancel = context.WithTimeoutCause(sctx, d, errStreamDeadline)
		defer cancel()
	}
	// The request is read whole before the response starts: HTTP/1 bodies close then.
	var req watchRequest
	rerr := readStreamRequest(r, &req)
	s := startStream(w)
	if rerr != nil {
		s.End(rerr)
		return
	}
	c, err := g.fsCallFor(sctx, t, t.user)
	if err != nil {
		s.End(watchEndError(sctx, err))
		return
	}
	wt, err := c.startWatch(sctx, req.Path, req.Recursive, req.includeEntry())
	if err != nil {
		s.End(watchEndError(sctx, err))
		return
	}
	if err := s.Send(watchDirResponse{Start: &struct{}{}}); err != nil {
		wt.ws.Close()
		return
	}

	// The reader goroutine owns wt until it returns; it ends when Next fails, which closing
	// the stream (below, when the request ends) makes it do.
	type result struct {
		event fsEvent
		err   error
	}
	events := make(chan result)
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(sctx)
	defer func() {
		cancel()
		wt.ws.Close()
		<-done
	}()
	go func() {
		defer close(done)
		for {
			ev, err := wt.next(ctx)
			select {
			case events <- result{ev, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()

	every := keepaliveEvery(r)
	keep := time.NewTimer(every)
	defer keep.Stop()
	for {
		select {
		case <-ctx.Done():
			s.End(watchEndError(sctx, ctx.Err()))
			return
		case <-keep.C:
			if err := s.Send(watchDirResponse{Keepalive: &struct{}{}}); err != nil {
				return
			}
			keep.Reset(every)
		case res := <-events:
			if errors.Is(res.err, io.EOF) {
				s.End(nil) // the watched directory went away: the watch is over
				return
			}
			if res.err != nil {
				s.End(watchEndError(sctx, res.err))
				return
			}
			if err := s.Send(watchDirResponse{Filesystem: &res.event}); err != nil {
				return
			}
			keep.Reset(every)
		}
	}
}

// errStreamDeadline is the cause of a stream's end at its Connect-Timeout-Ms.
var errStreamDeadline = errors.New("the stream reached the client's Connect-Timeout-Ms")

// watchEndError is the error a watch stream of the context ctx ends with: deadline_exceeded
// when the client's deadline passed and canceled when the client went away, whatever failed
// because of it; else err.
func watchEndError(ctx context.Context, err error) error {
	if errors.Is(context.Cause(ctx), errStreamDeadline) {
		return rpcErrorf(codeDeadlineExceeded, "%v", errStreamDeadline)
	}
	if ctx.Err() != nil {
		return rpcErrorf(codeCanceled, "the client went away")
	}
	return err
}

// pollWatcher is a watch kept for CreateWatcher: its events wait for GetWatcherEvents.
type pollWatcher struct {
	id      string
	sandbox string
	cancel  context.CancelFunc
	expire  *time.Timer // drops the watcher after watcherIdle without a poll

	mu sync.Mutex
	// The fields below are protected by mu.
	events []fsEvent
	err    error // what ended the watch; returned once the events before it are taken
}

func (g *Gateway) fsCreateWatcher(ctx context.Context, c *fsCall, req *watchRequest) (*createWatcherResponse, error) {
	st := g.fsState()
	st.mu.Lock()
	full := len(st.watchers) >= maxWatchers
	st.mu.Unlock()
	if full {
		return nil, rpcErrorf(codeResourceExhaust, "this gateway holds %d watchers, its most: remove some (RemoveWatcher) or use WatchDir", maxWatchers)
	}
	// The watch outlives this request; it ends with RemoveWatcher or after watcherIdle.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stopEarly := context.AfterFunc(ctx, cancel) // until the watch is armed, the request bounds it
	wt, err := c.startWatch(wctx, req.Path, req.Recursive, req.includeEntry())
	if !stopEarly() && err == nil {
		wt.ws.Close()
		err = fsError(ctx.Err(), "create watcher")
	}
	if err != nil {
		cancel()
		return nil, err
	}
	pw := &pollWatcher{id: newWatcherID(), sandbox: c.t.id, cancel: cancel}
	st.mu.Lock()
	if len(st.watchers) >= maxWatchers {
		st.mu.Unlock()
		wt.ws.Close()
		cancel()
		return nil, rpcErrorf(codeResourceExhaust, "this gateway holds %d watchers, its most: remove some (RemoveWatcher) or use WatchDir", maxWatchers)
	}
	st.watchers[pw.id] = pw
	pw.expire = time.AfterFunc(watcherIdle, func() { st.dropWatcher(pw.id) })
	st.mu.Unlock()

	// This goroutine owns wt; it ends when the watch fails, which dropping the watcher (its
	// context cancelled, its stream closed) makes it do.
	go func() {
		defer wt.ws.Close()
		stop := context.AfterFunc(wctx, func() { wt.ws.Close() })
		defer stop()
		for {
			ev, err := wt.next(wctx)
			pw.mu.Lock()
			switch {
			case err == nil && len(pw.events) >= maxWatcherEvents:
				err = rpcErrorf(codeResourceExhaust, "watcher %s: more than %d events since the last poll; events were lost: list the directory and create a new watcher", pw.id, maxWatcherEvents)
				pw.err = err
			case err == nil:
				pw.events = append(pw.events, ev)
			case !errors.Is(err, io.EOF) && pw.err == nil:
				pw.err = err
			}
			pw.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return &createWatcherResponse{WatcherID: pw.id}, nil
}

// watcher returns the polling watcher id of a sandbox, or not_found.
func (s *fsState) watcher(sandboxID, id string) (*pollWatcher, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pw, ok := s.watchers[id]
	if !ok || pw.sandbox != sandboxID {
		return nil, rpcErrorf(codeNotFound, "watcher with id %s not found", id)
	}
	return pw, nil
}

// dropWatcher removes a polling watcher and ends its watch.
func (s *fsState) dropWatcher(id string) bool {
	s.mu.Lock()
	pw, ok := s.watchers[id]
	delete(s.watchers, id)
	s.mu.Unlock()
	if ok {
		pw.expire.Stop()
		pw.cancel()
	}
	return ok
}

// closeWatchers ends every polling watcher (the Gateway closes).
func (s *fsState) closeWatchers() {
	s.mu.Lock()
	ids := make([]string, 0, len(s.watchers))
	for id := range s.watchers {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	for _, id := range ids {
		s.dropWatcher(id)
	}
}

func (g *Gateway) fsGetWatcherEvents(ctx context.Context, c *fsCall, req *watcherRequest) (*watcherEventsResponse, error) {
	pw, err := g.fsState().watcher(c.t.id, req.id())
	if err != nil {
		return nil, err
	}
	pw.expire.Reset(watcherIdle)
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if len(pw.events) == 0 && pw.err != nil {
		return nil, pw.err
	}
	out := &watcherEventsResponse{Events: pw.events}
	if out.Events == nil {
		out.Events = []fsEvent{}
	}
	pw.events = nil
	return out, nil
}

func (g *Gateway) fsRemoveWatcher(ctx context.Context, c *fsCall, req *watcherRequest) (*struct{}, error) {
	st := g.fsState()
	if _, err := st.watcher(c.t.id, req.id()); err != nil {
		return nil, err
	}
	st.dropWatcher(req.id())
	return &struct{}{}, nil
}
