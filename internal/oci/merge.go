package oci

import (
	"archive/tar"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// OCI whiteout names (image-spec layer.md).
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh." // AUFS bookkeeping, such as the .wh..wh.plnk hardlink directory
	opaqueMarker   = ".wh..wh..opq"
)

// maxEntries caps the archive entries one merge reads, over all its layers (the layer store takes
// a million per layer). The first pass keeps a few hundred bytes per entry.
const maxEntries = 2_000_000

type kind uint8

const (
	kDir      kind = iota
	kFile          // any non-directory: regular file, symlink, hardlink, device, fifo
	kWhiteout      // deleted by a layer of the merge
)

// node is one path of the merged tree.
type node struct {
	kind     kind
	layer    int              // position in the merge of the layer that last set the node
	opaque   bool             // kDir: hides what the layers below the merge have at this path
	below    bool             // the layers say that a layer below the merge has this path
	made     bool             // kDir: an entry of the merge (not only a whiteout) is in or below it
	hdr      *tar.Header      // kDir: its header, nil if no layer of the merge listed it
	children map[string]*node // kDir
	ino      *inode           // kFile
}

// inode is a file that one or more names of the merged tree share.
type inode struct {
	layer, entry int         // where it was created: position of the layer in the merge, index of the entry in its archive
	hdr          *tar.Header // symlinks, devices, fifos; nil for a file whose content the second pass copies
	names        []string    // its surviving names in output order, filled in by writeTree
}

// merger computes the tree that applying a run of layers in order gives.
type merger struct {
	root    *node
	keep    bool              // keep whiteouts and opaque markers: there are layers below the merge
	found   map[string]bool   // whiteouts whose target a layer below the merge was found to have
	names   []string          // the layers, for messages
	aufs    map[string]*inode // files under .wh..wh.* directories: only hardlinks reach them
	entries int
	// content[g][e] is the inode whose data is entry e of layer g; filled in by writeTree.
	content []map[int]*inode
}

func newMerger(names []string, keep bool) *merger {
	return &merger{
		root:  &node{kind: kDir, children: map[string]*node{}},
		keep:  keep,
		names: names,
		aufs:  map[string]*inode{},
	}
}

func (m *merger) invalid(g int, entry, format string, args ...any) error {
	if len(entry) > 160 {
		entry = entry[:100] + "..." + entry[len(entry)-40:]
	}
	return errdefs.Invalid("image", "%s: entry %s: %s", m.names[g], strconv.Quote(entry), fmt.Sprintf(format, args...))
}

// apply records entry e (header hdr) of the layer at position g.
func (m *merger) apply(g, e int, hdr *tar.Header) error {
	m.entries++
	if m.entries > maxEntries {
		return fmt.Errorf("%s: the layers hold more than %d entries: %w", m.names[g], maxEntries, errdefs.ErrTooLarge)
	}
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	rel, why := cleanName(hdr.Name)
	if why != "" {
		return m.invalid(g, hdr.Name, "%s", why)
	}
	if rel == "" {
		if hdr.Typeflag != tar.TypeDir {
			return m.invalid(g, hdr.Name, "the root is not a directory")
		}
		m.root.hdr, m.root.layer = hdr, g
		return nil
	}
	dir, base := splitPath(rel)
	switch {
	case base == opaqueMarker:
		if hasMeta(dir) {
			return nil
		}
		return m.opaque(g, dir)
	case hasMeta(rel):
		return m.stash(g, e, rel, hdr)
	case strings.HasPrefix(base, whiteoutPrefix):
		target := base[len(whiteoutPrefix):]
		if target == "" || target == "." || target == ".." {
			return m.invalid(g, hdr.Name, "whiteout names no entry")
		}
		return m.whiteout(g, joinPath(dir, target))
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return m.dir(g, rel, hdr)
	case tar.TypeLink:
		ino, err := m.linkTarget(g, hdr)
		if err != nil {
			return err
		}
		return m.put(g, rel, hdr, ino)
	}
	ino := &inode{layer: g, entry: e}
	if !hasContent(hdr.Typeflag) {
		ino.hdr = hdr
	}
	return m.put(g, rel, hdr, ino)
}

// walk returns the directory at rel, creating the directories missing on the way as set by layer
// g. A component that a layer of the merge deleted becomes an empty opaque directory. A component
// that is a file fails the entry when strict; otherwise walk returns nil (a whiteout below a file
// hides nothing).
func (m *merger) walk(g int, rel string, hdr *tar.Header, strict bool) (*node, error) {
	n := m.root
	if rel == "" {
		return n, nil
	}
	for comp := range strings.SplitSeq(rel, "/") {
		c := n.children[comp]
		switch {
		case c == nil:
			c = &node{kind: kDir, layer: g, made: strict, children: map[string]*node{}}
			n.children[comp] = c
		case c.kind == kWhiteout:
			if !strict {
				return nil, nil
			}
			c = &node{kind: kDir, layer: g, opaque: true, below: c.below, made: true, children: map[string]*node{}}
			n.children[comp] = c
		case c.kind == kFile:
			if !strict {
				return nil, nil
			}
			return nil, m.invalid(g, hdr.Name, "a parent is not a directory")
		}
		c.made = c.made || strict
		n = c
	}
	return n, nil
}

// dir records a directory. One that replaces a file or a whiteout is opaque: nothing of the layers
// below shows through it.
func (m *merger) dir(g int, rel string, hdr *tar.Header) error {
	dir, base := splitPath(rel)
	p, err := m.walk(g, dir, hdr, true)
	if err != nil {
		return err
	}
	if old := p.children[base]; old != nil && old.kind == kDir {
		old.hdr, old.layer = hdr, g
		return nil
	}
	old := p.children[base]
	p.children[base] = &node{kind: kDir, layer: g, hdr: hdr, opaque: old != nil, below: old != nil && old.below,
		made: true, children: map[string]*node{}}
	return nil
}

// put records a non-directory, replacing whatever was at rel with everything below it.
func (m *merger) put(g int, rel string, hdr *tar.Header, ino *inode) error {
	dir, base := splitPath(rel)
	p, err := m.walk(g, dir, hdr, true)
	if err != nil {
		return err
	}
	old := p.children[base]
	p.children[base] = &node{kind: kFile, layer: g, ino: ino, below: old != nil && old.below}
	return nil
}

// linkTarget finds the inode a hardlink names: an earlier non-directory of the merge.
func (m *merger) linkTarget(g int, hdr *tar.Header) (*inode, error) {
	target, why := cleanName(hdr.Linkname)
	if why != "" || target == "" {
		if why == "" {
			why = "it is the root"
		}
		return nil, m.invalid(g, hdr.Name, "hardlink target %q: %s", hdr.Linkname, why)
	}
	if ino := m.aufs[target]; ino != nil {
		return ino, nil
	}
	n := m.root
	for comp := range strings.SplitSeq(target, "/") {
		if n.kind != kDir {
			n = nil
			break
		}
		if n = n.children[comp]; n == nil {
			break
		}
	}
	if n == nil || n.kind != kFile {
		return nil, m.invalid(g, hdr.Name, "hardlink target %q is not a file that an earlier entry of these layers created", hdr.Linkname)
	}
	return n.ino, nil
}

// stash keeps a file below an AUFS .wh..wh.* directory out of the tree: it exists only as the
// target of hardlinks elsewhere.
func (m *merger) stash(g, e int, rel string, hdr *tar.Header) error {
	switch hdr.Typeflag {
	case tar.TypeDir:
		return nil
	case tar.TypeLink:
		ino, err := m.linkTarget(g, hdr)
		if err != nil {
			return err
		}
		m.aufs[rel] = ino
		return nil
	}
	ino := &inode{layer: g, entry: e}
	if !hasContent(hdr.Typeflag) {
		ino.hdr = hdr
	}
	m.aufs[rel] = ino
	return nil
}

// whiteout deletes rel and everything below it as the layers below layer g have it. An entry of
// layer g itself stays: a whiteout only hides lower layers.
//
// Image builders write a whiteout only for a path that a lower layer has. So when no earlier
// layer of the merge touched rel, a layer below the merge has it and the whiteout must stay. When
// one did, the path may be new in the merge: writeTree then keeps the whiteout only if the layers
// below have the path (found), because overlayfs lists a whiteout that hides nothing, in a
// directory no lower layer has, as a name that cannot be opened.
func (m *merger) whiteout(g int, rel string) error {
	dir, base := splitPath(rel)
	p, err := m.walk(g, dir, nil, false)
	if err != nil || p == nil {
		return err
	}
	old := p.children[base]
	if old != nil && old.layer == g && old.kind != kWhiteout {
		return nil
	}
	p.children[base] = &node{kind: kWhiteout, layer: g, below: old == nil || old.below}
	return nil
}

// opaque empties dir of what the layers below layer g put there.
func (m *merger) opaque(g int, dir string) error {
	d, err := m.walk(g, dir, nil, false)
	if err != nil || d == nil {
		return err
	}
	d.opaque = true
	prune(d, g)
	return nil
}

// prune removes from d what layers before g put there. A directory from before g that holds
// entries of layer g stays, as the unlisted parent of those entries.
func prune(d *node, g int) {
	for name, c := range d.children {
		if c.kind == kDir {
			prune(c, g)
		}
		if c.layer >= g {
			continue
		}
		if c.kind == kDir && len(c.children) > 0 {
			c.hdr, c.layer = nil, g
			continue
		}
		delete(d.children, name)
	}
}

// writeTree writes everything but regular files' content, depth-first with names sorted: the
// root's header, directories, symlinks, devices, fifos, and with keep the whiteouts and opaque
// markers. It records in m.content which entries the second pass must copy, and the names of each
// inode.
func (m *merger) writeTree(tw *tar.Writer, layers int) error {
	m.content = make([]map[int]*inode, layers)
	for i := range m.content {
		m.content[i] = map[int]*inode{}
	}
	if m.root.hdr != nil {
		if err := tw.WriteHeader(outHeader(m.root.hdr, "./")); err != nil {
			return err
		}
	}
	if m.keep && m.root.opaque {
		if err := tw.WriteHeader(markerHeader(opaqueMarker)); err != nil {
			return err
		}
	}
	return m.writeDir(tw, m.root, "", !m.root.opaque)
}

// uncertain lists the whiteouts writeTree keeps only if a layer below the merge has their path:
// those that replaced an entry of the merge, outside directories the merge made opaque.
func (m *merger) uncertain() []string {
	var paths []string
	var walk func(d *node, rel string)
	walk = func(d *node, rel string) {
		for name, c := range d.children {
			p := joinPath(rel, name)
			switch {
			case c.kind == kWhiteout && !c.below:
				paths = append(paths, p)
			case c.kind == kDir && !c.opaque:
				walk(c, p)
			}
		}
	}
	if m.keep && !m.root.opaque {
		walk(m.root, "")
	}
	return paths
}

// writeDir writes the entries below d. visible says whether the layers below the merge show
// through d: only there do whiteouts and opaque markers matter.
func (m *merger) writeDir(tw *tar.Writer, d *node, rel string, visible bool) error {
	for _, name := range slices.Sorted(maps.Keys(d.children)) {
		c := d.children[name]
		p := joinPath(rel, name)
		switch c.kind {
		case kDir:
			switch {
			case c.hdr != nil:
				if err := tw.WriteHeader(outHeader(c.hdr, p+"/")); err != nil {
					return err
				}
			case c.made:
				if err := tw.WriteHeader(implicitHeader(p + "/")); err != nil {
					return err
				}
			}
			if m.keep && visible && c.opaque {
				if err := tw.WriteHeader(markerHeader(p + "/" + opaqueMarker)); err != nil {
					return err
				}
			}
			if err := m.writeDir(tw, c, p, visible && !c.opaque); err != nil {
				return err
			}
		case kWhiteout:
			if m.keep && visible && (c.below || m.found[p]) {
				if err := tw.WriteHeader(markerHeader(joinPath(rel, whiteoutPrefix+name))); err != nil {
					return err
				}
			}
		case kFile:
			ino := c.ino
			ino.names = append(ino.names, p)
			switch {
			case ino.hdr == nil:
				m.content[ino.layer][ino.entry] = ino
			case len(ino.names) == 1:
				if err := tw.WriteHeader(outHeader(ino.hdr, p)); err != nil {
					return err
				}
			default:
				if err := tw.WriteHeader(linkHeader(ino.hdr, p, ino.names[0])); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// outHeader is hdr renamed to name, in PAX format (no length limits), with sparse files written
// out in full.
func outHeader(hdr *tar.Header, name string) *tar.Header {
	h := *hdr
	h.Name = name
	h.Format = tar.FormatPAX
	//lint:ignore SA1019 the reader puts the same records in PAXRecords; clear the copy
	h.Xattrs = nil
	if h.Typeflag == tar.TypeGNUSparse {
		h.Typeflag = tar.TypeReg
	}
	if h.PAXRecords != nil {
		h.PAXRecords = maps.Clone(h.PAXRecords)
		for k := range h.PAXRecords {
			if strings.HasPrefix(k, "GNU.sparse.") {
				delete(h.PAXRecords, k)
			}
		}
	}
	switch h.Typeflag {
	case tar.TypeDir, tar.TypeSymlink, tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		h.Size = 0
	}
	return &h
}

// linkHeader is a hardlink at name to target, an earlier entry with header hdr.
func linkHeader(hdr *tar.Header, name, target string) *tar.Header {
	return &tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: target, Mode: hdr.Mode,
		Uid: hdr.Uid, Gid: hdr.Gid, Uname: hdr.Uname, Gname: hdr.Gname, ModTime: hdr.ModTime,
		Format: tar.FormatPAX}
}

// implicitHeader is a directory that no layer lists but whose entries need it: 0755, owned by
// root, as the layer store creates the missing parents of an entry.
func implicitHeader(name string) *tar.Header {
	return &tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
}

// markerHeader is an OCI whiteout file: empty, mode 0, owner 0:0, time 0 (its metadata means
// nothing), as layers.WriteTar writes them.
func markerHeader(name string) *tar.Header {
	return &tar.Header{Name: name, Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
}

// hasContent reports whether entries of type t carry data the second pass copies.
func hasContent(t byte) bool {
	switch t {
	case tar.TypeSymlink, tar.TypeChar, tar.TypeBlock, tar.TypeFifo, tar.TypeDir, tar.TypeLink:
		return false
	}
	return true
}

// cleanName turns an archive name into a clean relative path ("" for the root), or says why it
// cannot be one. The rules are the layer store's: a leading "./" and trailing slashes are fine;
// absolute names, "." and ".." components, empty components and NUL bytes are not.
func cleanName(name string) (rel, why string) {
	switch {
	case name == "":
		return "", "empty name"
	case strings.IndexByte(name, 0) >= 0:
		return "", "name contains a NUL byte"
	case name[0] == '/':
		return "", "absolute path; entries must be relative to the layer root"
	}
	for strings.HasPrefix(name, "./") {
		name = name[2:]
	}
	name = strings.TrimRight(name, "/")
	if name == "" || name == "." {
		return "", ""
	}
	for comp := range strings.SplitSeq(name, "/") {
		switch comp {
		case "":
			return "", `empty path component ("//")`
		case ".":
			return "", `"." path component`
		case "..":
			return "", `".." path component; entries must stay inside the layer`
		}
	}
	return name, ""
}

// hasMeta reports whether a component of rel is AUFS bookkeeping (.wh..wh.*).
func hasMeta(rel string) bool {
	for comp := range strings.SplitSeq(rel, "/") {
		if strings.HasPrefix(comp, whiteoutMeta) {
			return true
		}
	}
	return false
}

func splitPath(rel string) (dir, base string) {
	i := strings.LastIndexByte(rel, '/')
	if i < 0 {
		return "", rel
	}
	return rel[:i], rel[i+1:]
}

func joinPath(dir, name string) string {
	if dir == "" {
		return name
	}
	return path.Join(dir, name)
}
