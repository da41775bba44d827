package agentrpc

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/corral-dev/corral/internal/errdefs"
)

// identity is a resolved user: what a command runs as or what a created file is owned by.
type identity struct {
	name   string // empty when the uid has no passwd entry
	uid    uint32
	gid    uint32
	groups []uint32 // supplementary groups, primary gid first
	home   string   // "/" when unknown
}

type passwdEntry struct {
	name     string
	uid, gid uint32
	home     string
}

type groupEntry struct {
	name    string
	gid     uint32
	members []string
}

// maxUserDBFile bounds how much of the sandbox's /etc/passwd or /etc/group is read: both are
// writable by the sandbox's root, so they are untrusted input.
const maxUserDBFile = 4 << 20

// userDB resolves user specs against the sandbox's /etc/passwd and /etc/group without cgo or any
// sandbox binary. Parsed files are cached until their size, mtime or inode changes.
type userDB struct {
	dir string // immutable: directory holding passwd and group

	mu sync.Mutex
	// Protected by mu:
	passwdKey, groupKey fileKey
	passwd              []passwdEntry
	groups              []groupEntry
}

type fileKey struct {
	ino, size int64
	mtime     syscall.Timespec
	ok        bool
}

// resolve turns a spec ("", "name", "uid", "name:group", "uid:gid") into an identity. The empty
// spec is root. A numeric uid need not exist in /etc/passwd (its gid is then 0 and its home "/");
// a name must.
func (d *userDB) resolve(spec string) (identity, error) {
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if userPart == "" {
		if hasGroup {
			return identity{}, errdefs.Invalid("user", "%q: missing user before ':'", spec)
		}
		userPart = "0"
	}
	passwd, groups, err := d.load()
	if err != nil {
		return identity{}, err
	}
	id, err := resolveIn(passwd, groups, d.dir, userPart, groupPart, hasGroup)
	if err != nil {
		return id, err
	}
	return id, ownMaps().check(id)
}

// idMaps are this process's user namespace's uid and gid maps (/proc/self/{uid,gid}_map): a
// sandbox with a user namespace of its own has ids 0-65535 only (internal/runtime/runc).
type idMaps struct{ uid, gid [][3]uint64 }

var ownMaps = sync.OnceValue(func() idMaps {
	read := func(f string) [][3]uint64 {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil // no /proc: nothing to check
		}
		var m [][3]uint64
		for _, line := range strings.Split(string(b), "\n") {
			var e [3]uint64
			if n, _ := fmt.Sscan(line, &e[0], &e[1], &e[2]); n == 3 {
				m = append(m, e)
			}
		}
		return m
	}
	return idMaps{uid: read("/proc/self/uid_map"), gid: read("/proc/self/gid_map")}
})

// check refuses an identity with an id the namespace does not map: the kernel would refuse
// to switch to it (EINVAL) after the command was accepted.
func (m idMaps) check(id identity) error {
	mapped := func(mp [][3]uint64, v uint32) bool {
		if mp == nil {
			return true
		}
		for _, e := range mp {
			if uint64(v) >= e[0] && uint64(v) < e[0]+e[2] {
				return true
			}
		}
		return false
	}
	if !mapped(m.uid, id.uid) {
		return errdefs.Invalid("user", "uid %d is outside this sandbox's user namespace (ids 0-%d)", id.uid, maxMapped(m.uid))
	}
	for _, g := range id.groups {
		if !mapped(m.gid, g) {
			return errdefs.Invalid("user", "gid %d is outside this sandbox's user namespace (ids 0-%d)", g, maxMapped(m.gid))
		}
	}
	return nil
}

func maxMapped(mp [][3]uint64) uint64 {
	var hi uint64
	for _, e := range mp {
		hi = max(hi, e[0]+e[2]-1)
	}
	return hi
}

// resolveIn resolves a parsed spec against parsed passwd and group entries read from dir.
func resolveIn(passwd []passwdEntry, groups []groupEntry, dir, userPart, groupPart string, hasGroup bool) (identity, error) {
	spec := userPart
	if hasGroup {
		spec += ":" + groupPart
	}
	id := identity{home: "/"}
	var pw *passwdEntry
	if uid, ok := parseID(userPart); ok {
		id.uid = uid
		for i := range passwd {
			if passwd[i].uid == uid {
				pw = &passwd[i]
				break
			}
		}
	} else {
		for i := range passwd {
			if passwd[i].name == userPart {
				pw = &passwd[i]
				break
			}
		}
		if pw == nil {
			return identity{}, errdefs.Invalid("user", "user %q not found in %s", userPart, filepath.Join(dir, "passwd"))
		}
		id.uid = pw.uid
	}
	if pw != nil {
		id.name, id.gid = pw.name, pw.gid
		if pw.home != "" {
			id.home = pw.home
		}
	}
	if hasGroup {
		if groupPart == "" {
			return identity{}, errdefs.Invalid("user", "%q: missing group after ':'", spec)
		}
		if gid, ok := parseID(groupPart); ok {
			id.gid = gid
		} else {
			found := false
			for _, g := range groups {
				if g.name == groupPart {
					id.gid, found = g.gid, true
					break
				}
			}
			if !found {
				return identity{}, errdefs.Invalid("user", "group %q not found in %s", groupPart, filepath.Join(dir, "group"))
			}
		}
	}
	id.groups = []uint32{id.gid}
	if id.name != "" {
		for _, g := range groups {
			if g.gid != id.gid && contains(g.members, id.name) && !containsID(id.groups, g.gid) {
				id.groups = append(id.groups, g.gid)
			}
		}
	}
	return id, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func containsID(list []uint32, id uint32) bool {
	for _, x := range list {
		if x == id {
			return true
		}
	}
	return false
}

// parseID parses a decimal uid or gid; -1 (4294967295) is not a valid id.
func parseID(s string) (uint32, bool) {
	if s == "" || s[0] < '0' || s[0] > '9' {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 1<<32-1 {
		return 0, false
	}
	return uint32(n), true
}

// load returns the parsed passwd and group files, re-reading those that changed. A missing file
// counts as empty.
func (d *userDB) load() ([]passwdEntry, []groupEntry, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	pk := statKey(filepath.Join(d.dir, "passwd"))
	if pk != d.passwdKey || !pk.ok {
		b, err := readSmallFile(filepath.Join(d.dir, "passwd"))
		if err != nil {
			return nil, nil, err
		}
		d.passwd, d.passwdKey = parsePasswd(bytes.NewReader(b)), pk
	}
	gk := statKey(filepath.Join(d.dir, "group"))
	if gk != d.groupKey || !gk.ok {
		b, err := readSmallFile(filepath.Join(d.dir, "group"))
		if err != nil {
			return nil, nil, err
		}
		d.groups, d.groupKey = parseGroup(bytes.NewReader(b)), gk
	}
	return d.passwd, d.groups, nil
}

func statKey(path string) fileKey {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileKey{}
	}
	return fileKey{ino: int64(st.Ino), size: st.Size, mtime: st.Mtim, ok: true}
}

func readSmallFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxUserDBFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxUserDBFile {
		return nil, fmt.Errorf("read %s: larger than %d bytes: %w", path, maxUserDBFile, errdefs.ErrTooLarge)
	}
	return b, nil
}

// parsePasswd parses passwd(5) lines (name:password:uid:gid:gecos:home:shell), skipping comments,
// NIS "+"/"-" lines and malformed lines.
func parsePasswd(r io.Reader) []passwdEntry {
	var out []passwdEntry
	forEachLine(r, func(line string) {
		f := strings.Split(line, ":")
		if len(f) < 7 || f[0] == "" || f[0][0] == '+' || f[0][0] == '-' {
			return
		}
		uid, ok1 := parseID(f[2])
		gid, ok2 := parseID(f[3])
		if !ok1 || !ok2 {
			return
		}
		out = append(out, passwdEntry{name: f[0], uid: uid, gid: gid, home: f[5]})
	})
	return out
}

// parseGroup parses group(5) lines (name:password:gid:member,member), skipping malformed lines.
func parseGroup(r io.Reader) []groupEntry {
	var out []groupEntry
	forEachLine(r, func(line string) {
		f := strings.Split(line, ":")
		if len(f) < 4 || f[0] == "" || f[0][0] == '+' || f[0][0] == '-' {
			return
		}
		gid, ok := parseID(f[2])
		if !ok {
			return
		}
		var members []string
		for _, m := range strings.Split(f[3], ",") {
			if m = strings.TrimSpace(m); m != "" {
				members = append(members, m)
			}
		}
		out = append(out, groupEntry{name: f[0], gid: gid, members: members})
	})
	return out
}

func forEachLine(r io.Reader, fn func(string)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 64<<10) // longer lines end the scan: the file is malformed
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		fn(line)
	}
}
