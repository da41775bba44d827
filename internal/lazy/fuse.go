//go:build linux

package lazy

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// The FUSE protocol is spoken here directly (go-fuse's structs give the wire layouts) rather
// than through go-fuse's Server, because a lazyd that replaces a crashed one must take over the
// kernel's connection as it is: already initialised (go-fuse's Server insists on reading INIT
// first), with node IDs and file handles the kernel got from the dead process. So:
//   - a blob's node ID is the first 8 bytes of its layer name (a SHA-256): any lazyd maps it back
//     to the layer from the tables directory, without having seen the LOOKUP;
//   - a file handle is the unique ID of the OPEN request (unique per connection, and the same
//     when the kernel resends the request), and the open handles are kept in a file beside the
//     mount (opensFile), so the next lazyd knows what is mounted and keeps it pinned;
//   - requests the dead process had read and not answered are asked back with
//     FUSE_NOTIFY_RESEND (Linux 6.9+) before the new one reads anything.

// FUSE opcodes (include/uapi/linux/fuse.h).
const (
	opLookup      = 1
	opForget      = 2
	opGetattr     = 3
	opSetattr     = 4
	opSymlink     = 6
	opMknod       = 8
	opMkdir       = 9
	opUnlink      = 10
	opRmdir       = 11
	opRename      = 12
	opLink        = 13
	opOpen        = 14
	opRead        = 15
	opWrite       = 16
	opStatfs      = 17
	opRelease     = 18
	opSetxattr    = 21
	opRemovexattr = 24
	opFlush       = 25
	opInit        = 26
	opOpendir     = 27
	opReaddir     = 28
	opReleasedir  = 29
	opCreate      = 35
	opInterrupt   = 36
	opDestroy     = 38
	opBatchForget = 42
	opFallocate   = 43
	opRename2     = 45
	opCopyRange   = 47
	opTmpfile     = 51

	notifyResend = 7       // FUSE_NOTIFY_RESEND
	uniqueResend = 1 << 63 // FUSE_UNIQUE_RESEND: set on a request the kernel sent again

	rootID = 1 // FUSE_ROOT_ID

	ourMinor     = 28      // protocol 7.28: max_pages
	maxRead      = 1 << 20 // 1 MiB READ requests
	maxWrite     = 128 << 10
	readBufBytes = maxWrite + 4096 // a request never exceeds max_write plus its headers
	readers      = 4               // goroutines reading /dev/fuse; each request is handled on its own
)

var (
	inHeaderSize  = int(unsafe.Sizeof(fuse.InHeader{}))
	outHeaderSize = int(unsafe.Sizeof(fuse.OutHeader{}))
)

// fuseConn serves the blob filesystem on one FUSE connection.
type fuseConn struct {
	s   *Server
	dev *os.File // /dev/fuse, this connection
	mnt string
	id  string // names the connection: its opens file is valid only for it
	// resumed: taken over from a lazyd that died
	resumed bool
	// resent counts requests the kernel sent again (the previous lazyd read them and died).
	resent atomic.Int64

	fd    int // dev's descriptor: the device stays open until every reader and handler is done
	loops sync.WaitGroup
	// handlers counts requests answered on goroutines of their own.
	handlers sync.WaitGroup

	opensMu sync.Mutex
	opens   map[uint64]string // file handle -> layer name, as in the opens file
}

// opensState is the opens file: the kernel's open handles of one connection.
type opensState struct {
	Conn  string            `json:"conn"`
	Opens map[string]string `json:"opens"` // file handle (decimal) -> layer name
}

const opensFile = "fuse-opens.json"

// mountFuse opens /dev/fuse and mounts a new connection at mnt.
func mountFuse(s *Server, mnt string) (*fuseConn, error) {
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/fuse: %w", err)
	}
	dev := os.NewFile(uintptr(fd), "/dev/fuse")
	// microvm sandboxes read the blobs through QEMU, which runs as a uid of its own and gets the
	// open descriptor from the edge: without allow_other the kernel refuses every request of
	// another uid, fstat and read through a passed descriptor included. Nobody else can reach
	// the files by path: the mount is under the 0700 data dir.
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0,max_read=%d,allow_other", fd, maxRead)
	if err := unix.Mount("corral-lazy", mnt, "fuse.corral", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		dev.Close()
		return nil, fmt.Errorf("mount FUSE at %s: %w", mnt, err)
	}
	c := &fuseConn{s: s, dev: dev, fd: fd, mnt: mnt, id: randomID(), opens: map[uint64]string{}}
	if err := c.saveOpens(); err != nil {
		c.unmount()
		return nil, err
	}
	return c, nil
}

// resumeFuse takes over a connection a previous lazyd served (dev, kept by the keeper): it
// loads that connection's open handles and has the kernel resend what the previous one left
// unanswered.
func resumeFuse(s *Server, mnt string, dev *os.File, id string) (*fuseConn, error) {
	c := &fuseConn{s: s, dev: dev, fd: int(dev.Fd()), mnt: mnt, id: id, opens: map[uint64]string{}, resumed: true}
	b, err := os.ReadFile(filepath.Join(s.cfg.Dir, opensFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var st opensState
	if err == nil {
		if err := json.Unmarshal(b, &st); err != nil {
			return nil, fmt.Errorf("read %s: %w", opensFile, err)
		}
	}
	if st.Conn == id {
		for k, name := range st.Opens {
			var fh uint64
			if _, err := fmt.Sscan(k, &fh); err != nil {
				continue
			}
			l, err := s.layer(name)
			if err != nil {
				s.cfg.Log.Warn("an open layer of the kept connection has no table any more", "layer", name, "err", err)
				continue
			}
			c.opens[fh] = name
			s.open(l)
		}
	} else if len(st.Opens) > 0 {
		s.cfg.Log.Warn("the opens file names another connection; resuming without it", "file_conn", st.Conn, "conn", id)
	}
	// Requests the dead lazyd read and never answered wait in the kernel's processing queue:
	// moved back to the pending queue, they are read again below.
	hdr := make([]byte, outHeaderSize)
	binary.NativeEndian.PutUint32(hdr[0:], uint32(outHeaderSize))
	binary.NativeEndian.PutUint32(hdr[4:], notifyResend)
	if _, err := unix.Write(c.fd, hdr); err != nil {
		// Before Linux 6.9: what the dead one had read stays unanswered (its readers wait).
		s.cfg.Log.Error("FUSE_NOTIFY_RESEND refused: requests the previous lazyd left unanswered stay pending", "err", err)
	}
	s.cfg.Log.Info("resumed the FUSE connection a previous lazyd served", "conn", id, "open_handles", len(c.opens))
	return c, nil
}

// serve starts the readers; they end when the connection does (unmounted or aborted).
func (c *fuseConn) serve() {
	for range readers {
		c.loops.Add(1)
		go c.loop()
	}
}

func (c *fuseConn) loop() {
	defer c.loops.Done()
	fd := c.fd
	buf := make([]byte, readBufBytes)
	for {
		n, err := unix.Read(fd, buf)
		switch {
		case err == unix.EINTR || err == unix.ENOENT || err == unix.EAGAIN:
			continue // interrupted, or a request aborted before it was read
		case err == unix.ENODEV:
			return // unmounted or aborted
		case err != nil:
			c.s.cfg.Log.Error("read /dev/fuse", "err", err)
			return
		case n < inHeaderSize:
			c.s.cfg.Log.Error("short FUSE request", "bytes", n)
			continue
		}
		// Requests are small (no writes reach a read-only filesystem): handlers that outlive
		// this loop's next read get a copy of their own.
		c.dispatch(append([]byte(nil), buf[:n]...))
	}
}

// dispatch answers one request (b, header included); those that may wait (READ, OPEN,
// RELEASE, which write the opens file) are answered on a goroutine of their own.
func (c *fuseConn) dispatch(b []byte) {
	h := *(*fuse.InHeader)(unsafe.Pointer(&b[0]))
	if h.Unique&uniqueResend != 0 && c.resent.Add(1) == 1 {
		c.s.cfg.Log.Info("answering requests the previous lazyd left unanswered", "opcode", h.Opcode)
	}
	switch h.Opcode {
	case opForget, opBatchForget, opInterrupt:
		// Node IDs are names, not references: nothing to forget. A read that is interrupted
		// finishes or times out on its own.
	case opInit:
		c.init(h, b)
	case opLookup:
		c.lookup(h, b)
	case opGetattr:
		c.getattr(h)
	case opOpen:
		c.async(func() { c.open(h, b) })
	case opRead:
		c.async(func() { c.read(h, b) })
	case opRelease:
		c.async(func() { c.release(h, b) })
	case opOpendir:
		if h.NodeId != rootID {
			c.replyErr(h, unix.ENOTDIR)
			return
		}
		out := fuse.OpenOut{}
		c.reply(h, 0, asBytes(&out))
	case opReaddir:
		c.readdir(h, b)
	case opReleasedir, opFlush, opDestroy:
		c.reply(h, 0, nil)
	case opStatfs:
		out := fuse.StatfsOut{Bsize: 4096, Frsize: 4096, NameLen: 255}
		c.reply(h, 0, asBytes(&out))
	case opSetattr, opSymlink, opMknod, opMkdir, opUnlink, opRmdir, opRename, opLink, opWrite,
		opSetxattr, opRemovexattr, opCreate, opFallocate, opRename2, opCopyRange, opTmpfile:
		c.replyErr(h, unix.EROFS)
	default:
		c.replyErr(h, unix.ENOSYS) // xattrs, access, ioctl, poll, lseek...: the kernel stops asking
	}
}

// async answers a request on a goroutine of its own.
func (c *fuseConn) async(f func()) {
	c.handlers.Add(1)
	go func() {
		defer c.handlers.Done()
		f()
	}()
}

// asBytes is v's memory, for writing a wire struct.
func asBytes[T any](v *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v))
}

// request views b as the request struct T (which starts with the header), or nil when b is
// shorter.
func request[T any](b []byte) *T {
	var zero T
	if len(b) < int(unsafe.Sizeof(zero)) {
		return nil
	}
	return (*T)(unsafe.Pointer(&b[0]))
}

func (c *fuseConn) init(h fuse.InHeader, b []byte) {
	in := request[fuse.InitIn](b)
	if in == nil || in.Major != 7 || in.Minor < ourMinor {
		c.s.cfg.Log.Error("the kernel's FUSE protocol is not 7.28 or later", "request_bytes", len(b))
		c.replyErr(h, unix.EPROTO)
		return
	}
	want := uint64(fuse.CAP_ASYNC_READ | fuse.CAP_BIG_WRITES | fuse.CAP_MAX_PAGES | fuse.CAP_PARALLEL_DIROPS)
	flags := in.Flags64() & want
	out := fuse.InitOut{Major: 7, Minor: ourMinor, MaxReadAhead: in.MaxReadAhead, MaxBackground: 64,
		CongestionThreshold: 48, MaxWrite: maxWrite, MaxPages: maxRead / 4096, MaxStackDepth: 1,
		Flags: uint32(flags), Flags2: uint32(flags >> 32)}
	c.reply(h, 0, asBytes(&out))
}

const entryTimeout = time.Hour

func (c *fuseConn) lookup(h fuse.InHeader, b []byte) {
	if h.NodeId != rootID {
		c.replyErr(h, unix.ENOTDIR)
		return
	}
	name, _, _ := strings.Cut(string(b[inHeaderSize:]), "\x00")
	hexName, ok := strings.CutSuffix(name, ".blob")
	if !ok || !nameRE.MatchString(hexName) {
		c.replyErr(h, unix.ENOENT)
		return
	}
	l, err := c.s.layer(hexName)
	if err != nil {
		if !errors.Is(err, errdefs.ErrNotFound) {
			c.s.cfg.Log.Error("load a layer's chunk table", "layer", hexName, "err", err)
			c.replyErr(h, unix.EIO)
			return
		}
		c.replyErr(h, unix.ENOENT)
		return
	}
	if l.ino < 2 {
		c.s.cfg.Log.Error("a layer name gives no usable node ID", "layer", hexName)
		c.replyErr(h, unix.EIO)
		return
	}
	out := fuse.EntryOut{NodeId: l.ino}
	out.SetEntryTimeout(entryTimeout)
	out.SetAttrTimeout(entryTimeout)
	l.attr(&out.Attr)
	c.reply(h, 0, asBytes(&out))
}

func (l *layer) attr(a *fuse.Attr) {
	a.Mode = syscall.S_IFREG | 0o400
	a.Size = uint64(l.t.DataSize)
	a.Blocks = (a.Size + 511) / 512
	a.Nlink = 1
	a.Ino = l.ino
	a.Blksize = 4096
}

func (c *fuseConn) getattr(h fuse.InHeader) {
	out := fuse.AttrOut{}
	out.SetTimeout(entryTimeout)
	if h.NodeId == rootID {
		out.Attr = fuse.Attr{Ino: rootID, Mode: syscall.S_IFDIR | 0o755, Nlink: 2, Blksize: 4096}
		c.reply(h, 0, asBytes(&out))
		return
	}
	l, err := c.s.layerByID(h.NodeId)
	if err != nil {
		c.s.cfg.Log.Warn("getattr of an unknown node", "node", h.NodeId, "err", err)
		c.replyErr(h, unix.ESTALE)
		return
	}
	l.attr(&out.Attr)
	c.reply(h, 0, asBytes(&out))
}

// open answers OPEN with the request's unique ID as the handle: the kernel sends an OPEN again
// with the same ID (and the resend bit) when a lazyd died before answering, so the handle is
// recorded once however often it is asked.
func (c *fuseConn) open(h fuse.InHeader, b []byte) {
	in := request[fuse.OpenIn](b)
	if in == nil {
		c.replyErr(h, unix.EIO)
		return
	}
	if in.Flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC) != 0 {
		c.replyErr(h, unix.EROFS)
		return
	}
	c.s.mu.Lock()
	closing := c.s.closing
	c.s.mu.Unlock()
	if closing {
		c.replyErr(h, unix.ENOTCONN) // exiting: a mount now would read through a dead server
		return
	}
	l, err := c.s.layerByID(h.NodeId)
	if err != nil {
		c.replyErr(h, unix.ESTALE)
		return
	}
	fh := h.Unique &^ uniqueResend
	c.opensMu.Lock()
	_, again := c.opens[fh]
	if !again {
		c.opens[fh] = l.name
		c.s.open(l)
	}
	// Recorded before the kernel hears of the handle: a lazyd that dies in between leaves a
	// handle the next one knows (the resent OPEN finds it).
	err = c.saveOpens()
	c.opensMu.Unlock()
	if err != nil {
		c.s.cfg.Log.Error("record an open handle", "layer", l.name, "err", err)
	}
	out := fuse.OpenOut{Fh: fh}
	c.reply(h, 0, asBytes(&out))
}

func (c *fuseConn) release(h fuse.InHeader, b []byte) {
	in := request[fuse.ReleaseIn](b)
	if in == nil {
		c.replyErr(h, unix.EIO)
		return
	}
	c.opensMu.Lock()
	name, ok := c.opens[in.Fh]
	var err error
	if ok {
		delete(c.opens, in.Fh)
		err = c.saveOpens()
	}
	c.opensMu.Unlock()
	if err != nil {
		c.s.cfg.Log.Error("record a released handle", "layer", name, "err", err)
	}
	if ok {
		if l, lerr := c.s.layer(name); lerr == nil {
			c.s.release(l)
		}
	}
	c.reply(h, 0, nil)
}

func (c *fuseConn) read(h fuse.InHeader, b []byte) {
	in := request[fuse.ReadIn](b)
	if in == nil {
		c.replyErr(h, unix.EIO)
		return
	}
	l, err := c.s.layerByID(h.NodeId)
	if err != nil {
		c.replyErr(h, unix.ESTALE)
		return
	}
	size := min(int(in.Size), maxRead)
	buf := make([]byte, outHeaderSize+size)
	got, err := c.s.read(c.s.ctx, l, buf[outHeaderSize:], int64(in.Offset), h.Pid)
	if err != nil {
		c.replyErr(h, unix.EIO)
		return
	}
	c.send(h, 0, buf[:outHeaderSize+got])
}

// readdir lists <name>.blob for every layer with a chunk table.
func (c *fuseConn) readdir(h fuse.InHeader, b []byte) {
	in := request[fuse.ReadIn](b)
	if in == nil || h.NodeId != rootID {
		c.replyErr(h, unix.ENOTDIR)
		return
	}
	type ent struct {
		ino  uint64
		name string
		typ  uint32
	}
	ents := []ent{{rootID, ".", unix.DT_DIR}, {rootID, "..", unix.DT_DIR}}
	for _, n := range c.s.tableNames() {
		ents = append(ents, ent{nodeID(n), n + ".blob", unix.DT_REG})
	}
	var out []byte
	for i := int(in.Offset); i < len(ents); i++ {
		e := ents[i]
		rec := (24 + len(e.name) + 7) &^ 7
		if len(out)+rec > int(in.Size) {
			break
		}
		d := make([]byte, rec)
		binary.NativeEndian.PutUint64(d[0:], e.ino)
		binary.NativeEndian.PutUint64(d[8:], uint64(i+1))
		binary.NativeEndian.PutUint32(d[16:], uint32(len(e.name)))
		binary.NativeEndian.PutUint32(d[20:], e.typ)
		copy(d[24:], e.name)
		out = append(out, d...)
	}
	c.reply(h, 0, out)
}

// reply writes one answer: the header, then data.
func (c *fuseConn) reply(h fuse.InHeader, errno syscall.Errno, data []byte) {
	buf := make([]byte, outHeaderSize+len(data))
	copy(buf[outHeaderSize:], data)
	c.send(h, errno, buf)
}

// send writes buf, whose first outHeaderSize bytes it fills with the header.
func (c *fuseConn) send(h fuse.InHeader, errno syscall.Errno, buf []byte) {
	if errno != 0 {
		buf = buf[:outHeaderSize]
	}
	binary.NativeEndian.PutUint32(buf[0:], uint32(len(buf)))
	binary.NativeEndian.PutUint32(buf[4:], uint32(-int32(errno)))
	binary.NativeEndian.PutUint64(buf[8:], h.Unique)
	if _, err := unix.Write(c.fd, buf); err != nil && err != unix.ENOENT {
		// ENOENT: the request was interrupted, or handed back for resending.
		c.s.cfg.Log.Warn("answer a FUSE request", "opcode", h.Opcode, "err", err)
	}
}

func (c *fuseConn) replyErr(h fuse.InHeader, errno syscall.Errno) {
	c.send(h, errno, make([]byte, outHeaderSize))
}

// unmount detaches the mount (waiting for the readers to end) and closes the device.
func (c *fuseConn) unmount() error {
	var err error
	for try, delay := 0, 5*time.Millisecond; try < 5; try, delay = try+1, 2*delay {
		if err = unix.Unmount(c.mnt, 0); err == nil || err == unix.EINVAL {
			err = nil
			break
		}
		time.Sleep(delay)
	}
	if err != nil {
		return err
	}
	c.loops.Wait()
	c.handlers.Wait()
	return c.dev.Close()
}

// saveOpens writes the open handles where the next lazyd finds them, whole or not at all.
func (c *fuseConn) saveOpens() error {
	st := opensState{Conn: c.id, Opens: make(map[string]string, len(c.opens))}
	for fh, name := range c.opens {
		st.Opens[fmt.Sprint(fh)] = name
	}
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(c.s.cfg.Dir, opensFile), b)
}

// nodeID is the FUSE node ID (and inode number) of layer name: the first 8 bytes of the name,
// the same in every lazyd.
func nodeID(name string) uint64 {
	b, err := hex.DecodeString(name[:16])
	if err != nil {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

// layerByID returns the layer whose node ID is id: a loaded one, else the one table whose name
// starts with it (a lazyd that took over the connection gets requests for nodes it never looked
// up).
func (s *Server) layerByID(id uint64) (*layer, error) {
	s.mu.Lock()
	l := s.byID[id]
	s.mu.Unlock()
	if l != nil {
		return l, nil
	}
	prefix := fmt.Sprintf("%016x", id)
	matches, _ := filepath.Glob(filepath.Join(s.cfg.Dir, tablesDir, prefix+"*.json"))
	var names []string
	for _, m := range matches {
		if n := strings.TrimSuffix(filepath.Base(m), ".json"); nameRE.MatchString(n) {
			names = append(names, n)
		}
	}
	if len(names) != 1 {
		return nil, fmt.Errorf("node %s: %d layers: %w", prefix, len(names), errdefs.ErrNotFound)
	}
	return s.layer(names[0])
}

// tableNames lists the layers with a chunk table on this node.
func (s *Server) tableNames() []string {
	ents, _ := os.ReadDir(filepath.Join(s.cfg.Dir, tablesDir))
	var names []string
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), ".json"); ok && nameRE.MatchString(n) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}
