package agentrpc

import (
	"sort"
	"sync"
)

// Output streams.
const (
	streamStdout uint8 = 1
	streamStderr uint8 = 2
)

// output keeps the most recent output of one command, stdout and stderr interleaved in the order
// the agent read them, and lets any number of readers follow it from any kept offset.
//
// The bytes live in a ring indexed by absolute offset (offset o sits at o % len(buf)); the ring
// grows by doubling up to limit, so a quiet command costs nothing. Which stream a byte came from
// is kept as a list of segments, one per switch between stdout and stderr. Writers never wait for
// readers: when the limit is reached the oldest bytes are dropped, and a reader that was behind
// learns it through a truncated chunk. The segment list is bounded too (maxSegs); a command that
// alternates streams byte by byte therefore keeps less than limit bytes of data, never more than
// about limit + limit/16 bytes of memory.
type output struct {
	limit   int64 // immutable
	maxSegs int   // immutable

	mu sync.Mutex
	// Protected by mu:
	buf        []byte
	start, end int64     // kept offsets are [start, end)
	segs       []segment // sorted by off; segs[0].off <= start whenever start < end
	changed    chan struct{}
	closed     bool  // no more writes; exit is final
	exit       *Exit // set by close
}

// segment says that the bytes from off up to the next segment came from stream.
type segment struct {
	off    int64
	stream uint8
}

func newOutput(limit int64) *output {
	return &output{limit: limit, maxSegs: int(max(64, limit/256)), changed: make(chan struct{})}
}

// write appends p, which came from stream. It never blocks on readers.
func (o *output) write(stream uint8, p []byte) {
	if len(p) == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	n := int64(len(p))
	if n > o.limit { // only the tail of p fits
		skip := n - o.limit
		o.end += skip
		o.dropLocked(o.end)
		p, n = p[skip:], o.limit
	}
	if over := o.end + n - o.start - o.limit; over > 0 {
		o.dropLocked(o.start + over)
	}
	if len(o.segs) == 0 || o.segs[len(o.segs)-1].stream != stream {
		if len(o.segs) >= o.maxSegs {
			o.dropLocked(o.segs[1].off)
		}
		o.segs = append(o.segs, segment{off: o.end, stream: stream})
	}
	o.resizeLocked(o.end + n - o.start)
	ringWrite(o.buf, o.end, p)
	o.end += n
	close(o.changed)
	o.changed = make(chan struct{})
}

// dropLocked forgets the bytes before off.
// Preconditions: o.mu held; o.start <= off <= o.end.
func (o *output) dropLocked(off int64) {
	o.start = off
	i := 0
	for i+1 < len(o.segs) && o.segs[i+1].off <= off {
		i++
	}
	o.segs = o.segs[i:]
	if o.start == o.end {
		o.segs = o.segs[:0]
	}
}

// resizeLocked makes the ring hold at least need bytes (need <= limit); when need is smaller than
// the ring and the output is closed it shrinks the ring to exactly the kept bytes.
// Preconditions: o.mu held; need >= o.end - o.start.
func (o *output) resizeLocked(need int64) {
	size := int64(len(o.buf))
	var n int64
	switch {
	case need > size:
		n = min(max(2*size, need, 4<<10), o.limit)
	case o.closed && need < size:
		n = need
	default:
		return
	}
	var nb []byte
	if n > 0 {
		nb = make([]byte, n)
		for off := o.start; off < o.end && size > 0; {
			i := off % size
			c := min(size-i, o.end-off)
			ringWrite(nb, off, o.buf[i:i+c])
			off += c
		}
	}
	o.buf = nb
}

// close marks the output complete; readers that reach the end then see exit.
func (o *output) close(exit *Exit) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	o.closed, o.exit = true, exit
	o.resizeLocked(o.end - o.start)
	o.segs = append([]segment(nil), o.segs...) // drop the slack of the appends
	close(o.changed)
}

// bounds returns the kept range [start, end).
func (o *output) bounds() (start, end int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.start, o.end
}

// memory returns the bytes held for the kept output.
func (o *output) memory() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return int64(len(o.buf)) + int64(cap(o.segs))*16
}

// retainedMemory returns what memory will return once close has compacted the output.
func (o *output) retainedMemory() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.end - o.start + int64(len(o.segs))*16
}

// chunk is what read found at an offset.
type chunk struct {
	kind    chunkKind
	stream  uint8 // chunkData
	off     int64 // chunkData: offset of the bytes; chunkTruncated: where data resumes; chunkEnd: end
	n       int   // chunkData: bytes copied
	dropped int64 // chunkTruncated
	exit    *Exit // chunkEnd
	wait    <-chan struct{}
}

type chunkKind uint8

const (
	chunkData      chunkKind = iota // p[:n] holds bytes of one stream starting at off
	chunkTruncated                  // bytes before off were dropped; continue at off
	chunkEnd                        // the output is closed and off is its end
	chunkWait                       // nothing yet: wait for wait to close, then read again
)

// read copies the output at off into p, never more than one stream's bytes at a time.
func (o *output) read(off int64, p []byte) chunk {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case off < o.start:
		return chunk{kind: chunkTruncated, off: o.start, dropped: o.start - off}
	case off < o.end:
		i := sort.Search(len(o.segs), func(i int) bool { return o.segs[i].off > off }) - 1
		segEnd := o.end
		if i+1 < len(o.segs) {
			segEnd = o.segs[i+1].off
		}
		n := min(int64(len(p)), segEnd-off)
		ringRead(o.buf, off, p[:n])
		return chunk{kind: chunkData, stream: o.segs[i].stream, off: off, n: int(n)}
	case o.closed:
		return chunk{kind: chunkEnd, off: o.end, exit: o.exit}
	}
	return chunk{kind: chunkWait, wait: o.changed}
}

// ringWrite copies p into buf at the position of offset off. Preconditions: len(p) <= len(buf).
func ringWrite(buf []byte, off int64, p []byte) {
	i := off % int64(len(buf))
	n := copy(buf[i:], p)
	copy(buf, p[n:])
}

// ringRead fills p from buf starting at the position of offset off. Preconditions: len(p) <= len(buf).
func ringRead(buf []byte, off int64, p []byte) {
	if len(p) == 0 {
		return
	}
	i := off % int64(len(buf))
	n := copy(p, buf[i:])
	copy(p[n:], buf)
}
