//go:build linux

package chunkcache

// links are an entry's place in one entryList; both are nil while it is in none.
type links struct{ prev, next *entry }

// entryList is an intrusive, circular, doubly linked list of entries, most recently used at
// the front. It allocates nothing, which keeps pinning and reading free of garbage. field
// picks which of an entry's links the list uses, so an entry can be in one list of each kind.
type entryList struct {
	root  entry // sentinel: its links hold the front (next) and the back (prev)
	len   int
	field func(*entry) *links
}

func newEntryList(field func(*entry) *links) *entryList {
	l := &entryList{field: field}
	r := field(&l.root)
	r.prev, r.next = &l.root, &l.root
	return l
}

// contains reports whether e is in a list of this kind.
func (l *entryList) contains(e *entry) bool { return l.field(e).next != nil }

func (l *entryList) pushFront(e *entry) {
	at := &l.root
	next := l.field(at).next
	le := l.field(e)
	le.prev, le.next = at, next
	l.field(at).next = e
	l.field(next).prev = e
	l.len++
}

func (l *entryList) remove(e *entry) {
	le := l.field(e)
	l.field(le.prev).next = le.next
	l.field(le.next).prev = le.prev
	le.prev, le.next = nil, nil
	l.len--
}

func (l *entryList) moveToFront(e *entry) {
	if l.field(&l.root).next != e {
		l.remove(e)
		l.pushFront(e)
	}
}

// back returns the least recently used entry, or nil.
func (l *entryList) back() *entry {
	if b := l.field(&l.root).prev; b != &l.root {
		return b
	}
	return nil
}

// clear empties the list, unlinking every entry.
func (l *entryList) clear() {
	for e := l.back(); e != nil; e = l.back() {
		l.remove(e)
	}
}
