//go:build linux

package blobstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// backend is what the conformance suite needs from a backend's test.
type backend struct {
	// open returns a new, empty store.
	open func(t *testing.T) Store
	// leftovers lists what Puts left behind in the store's location besides objects (temp files,
	// incomplete multipart uploads). Once every Put has returned it must find nothing.
	leftovers func(t *testing.T, s Store) []string
}

// testConformance runs the contract of Store against one backend. Every backend runs all of it.
func testConformance(t *testing.T, b backend) {
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, b backend)
	}{
		{"PutGet", testPutGet},
		{"GetRange", testGetRange},
		{"Stat", testStat},
		{"List", testList},
		{"Delete", testDelete},
		{"BadKeys", testBadKeys},
		{"BadPrefixes", testBadPrefixes},
		{"MissingKeys", testMissingKeys},
		{"WrongSize", testWrongSize},
		{"ReaderError", testReaderError},
		{"Atomic", testAtomic},
		{"ConcurrentPuts", testConcurrentPuts},
		{"Large", testLarge},
		{"CancelPut", testCancelPut},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, b) })
	}
}

// sizes are the ways a test hands Put a length: exact, or unknown.
var sizes = []struct {
	name  string
	known bool
}{{"KnownSize", true}, {"UnknownSize", false}}

func putSize(known bool, data []byte) int64 {
	if known {
		return int64(len(data))
	}
	return -1
}

func mustPut(t *testing.T, s Store, key string, data []byte, known bool) {
	t.Helper()
	// A plain io.Reader, so that no backend gets to take a seekable shortcut.
	if err := s.Put(t.Context(), key, struct{ io.Reader }{bytes.NewReader(data)}, putSize(known, data)); err != nil {
		t.Fatalf("Put(%s): %v", key, err)
	}
}

func mustGet(t *testing.T, s Store, key string) []byte {
	t.Helper()
	rc, err := s.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	defer rc.Close()
	got, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("Get(%s): read: %v", key, err)
	}
	return got
}

func checkContent(t *testing.T, s Store, key string, want []byte) {
	t.Helper()
	if got := mustGet(t, s, key); !bytes.Equal(got, want) {
		t.Fatalf("Get(%s) = %d bytes %.40q, want %d bytes %.40q", key, len(got), got, len(want), want)
	}
}

func checkNoLeftovers(t *testing.T, b backend, s Store) {
	t.Helper()
	if got := b.leftovers(t, s); len(got) > 0 {
		t.Errorf("leftovers after every Put returned: %q", got)
	}
}

func checkNotFound(t *testing.T, s Store, key string) {
	t.Helper()
	if info, err := s.Stat(t.Context(), key); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Stat(%s) = %+v, %v; want an error wrapping ErrNotFound", key, info, err)
	}
}

func randomBytes(seed uint64, n int) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)}).Read(b)
	return b
}

func testPutGet(t *testing.T, b backend) {
	s := b.open(t)
	for _, sz := range sizes {
		t.Run(sz.name, func(t *testing.T) {
			for _, tc := range []struct {
				key  string
				data []byte
			}{
				{"empty", nil},
				{"small", []byte("hello")},
				{"records/x.json", []byte(`{"a":1}`)},
				{"layers/sha256:00ff/image.erofs", randomBytes(1, 300<<10)},
				{"A-Z_a-z.0-9:x", []byte("all the characters")},
				{strings.Repeat("a", 255) + "/" + strings.Repeat("b", 254) + "/c", []byte("a key of 512 bytes")},
			} {
				key := sz.name + "/" + tc.key
				if len(key) > MaxKeyLen {
					key = tc.key
				}
				mustPut(t, s, key, tc.data, sz.known)
				checkContent(t, s, key, tc.data)
			}
			// Put replaces, with shorter and then longer content.
			key := sz.name + "/replaced"
			for _, data := range []string{"first version, long", "second", "third version, longest of all"} {
				mustPut(t, s, key, []byte(data), sz.known)
				checkContent(t, s, key, []byte(data))
			}
		})
	}
	checkNoLeftovers(t, b, s)
}

func testGetRange(t *testing.T, b backend) {
	s := b.open(t)
	const data = "0123456789"
	mustPut(t, s, "r", []byte(data), true)
	mustPut(t, s, "empty", nil, true)
	for _, tc := range []struct {
		key         string
		off, length int64
		want        string
	}{
		{"r", 0, 3, "012"},
		{"r", 4, 2, "45"},
		{"r", 0, 10, data},
		{"r", 7, 10, "789"}, // short at the end
		{"r", 9, 1, "9"},
		{"r", 10, 5, ""}, // at the end
		{"r", 20, 5, ""}, // past the end
		{"r", 3, 0, ""},
		{"empty", 0, 4, ""},
		{"empty", 0, 0, ""},
	} {
		rc, err := s.GetRange(t.Context(), tc.key, tc.off, tc.length)
		if err != nil {
			t.Errorf("GetRange(%s, %d, %d): %v", tc.key, tc.off, tc.length, err)
			continue
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || string(got) != tc.want {
			t.Errorf("GetRange(%s, %d, %d) = %q, %v; want %q", tc.key, tc.off, tc.length, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ off, length int64 }{{-1, 3}, {0, -1}} {
		if _, err := s.GetRange(t.Context(), "r", tc.off, tc.length); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("GetRange(r, %d, %d) error = %v, want ErrInvalid", tc.off, tc.length, err)
		}
	}
}

func testStat(t *testing.T, b backend) {
	s := b.open(t)
	// S3 keeps whole seconds.
	before := time.Now().Add(-time.Second).Truncate(time.Second)
	mustPut(t, s, "a/b", []byte("12345"), false)
	after := time.Now().Add(time.Second)
	info, err := s.Stat(t.Context(), "a/b")
	if err != nil {
		t.Fatal(err)
	}
	if info.Key != "a/b" || info.Size != 5 || info.ModTime.Before(before) || info.ModTime.After(after) {
		t.Errorf("Stat(a/b) = %+v, want key a/b, size 5, mtime in [%v, %v]", info, before, after)
	}
	// "a" is a prefix of a key but no object.
	checkNotFound(t, s, "a")
}

func testList(t *testing.T, b backend) {
	s := b.open(t)
	keys := []string{"b/x", "ab", "a/c/d", "a/b", "a.z", "a-b", "c"}
	for i, k := range keys {
		mustPut(t, s, k, bytes.Repeat([]byte("x"), i), false)
	}
	size := func(k string) int64 { return int64(slices.Index(keys, k)) }
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"", []string{"a-b", "a.z", "a/b", "a/c/d", "ab", "b/x", "c"}},
		{"a", []string{"a-b", "a.z", "a/b", "a/c/d", "ab"}},
		{"a/", []string{"a/b", "a/c/d"}},
		{"a/c", []string{"a/c/d"}},
		{"a/c/", []string{"a/c/d"}},
		{"a/c/d", []string{"a/c/d"}},
		{"a/b/", nil}, // a/b is an object, nothing is below it
		{"a/c/d/", nil},
		{"b", []string{"b/x"}},
		{"c", []string{"c"}},
		{"zz", nil},
		{"zz/", nil},
		{"zz/y", nil},
		{".", nil},
	} {
		infos, err := s.List(t.Context(), tc.prefix)
		if err != nil {
			t.Errorf("List(%q): %v", tc.prefix, err)
			continue
		}
		var got []string
		for _, in := range infos {
			got = append(got, in.Key)
			if in.Size != size(in.Key) || in.ModTime.IsZero() {
				t.Errorf("List(%q): %+v, want size %d and a modification time", tc.prefix, in, size(in.Key))
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("List(%q) = %q, want %q", tc.prefix, got, tc.want)
		}
	}
}

func testDelete(t *testing.T, b backend) {
	s := b.open(t)
	mustPut(t, s, "a/b", []byte("1"), false)
	mustPut(t, s, "c", []byte("2"), false)
	for _, key := range []string{"c", "c", "missing", "x/y/z", "a"} {
		if err := s.Delete(t.Context(), key); err != nil {
			t.Errorf("Delete(%s): %v", key, err)
		}
	}
	checkNotFound(t, s, "c")
	// Deleting "a", which is only a prefix, left the object below it alone.
	checkContent(t, s, "a/b", []byte("1"))
	if err := s.Delete(t.Context(), "a/b"); err != nil {
		t.Fatal(err)
	}
	checkNotFound(t, s, "a/b")
	if infos, err := s.List(t.Context(), ""); err != nil || len(infos) != 0 {
		t.Errorf("List after deleting everything = %+v, %v; want nothing", infos, err)
	}
}

// badKeys are keys every method must refuse.
var badKeys = []string{
	"", "/a", "a/", "a//b", ".", "..", "./a", "a/.", "a/../b", "a b", "a\\b", "a\x00b", "ä", "a\nb",
	"a?b", "a%2fb", "a*", ".tmp", ".tmp/x", strings.Repeat("a", MaxKeyLen+1), strings.Repeat("a", MaxSegmentLen+1),
	strings.Repeat("a/", MaxKeyLen/2) + "a",
}

func testBadKeys(t *testing.T, b backend) {
	s := b.open(t)
	ctx := t.Context()
	for _, key := range badKeys {
		ops := map[string]error{
			"Put":  s.Put(ctx, key, strings.NewReader("x"), 1),
			"Stat": func() error { _, err := s.Stat(ctx, key); return err }(),
			"Get":  func() error { _, err := s.Get(ctx, key); return err }(),
			"GetRange": func() error {
				_, err := s.GetRange(ctx, key, 0, 1)
				return err
			}(),
			"Delete": s.Delete(ctx, key),
		}
		for op, err := range ops {
			if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Field(err) != "key" {
				t.Errorf("%s(%q) error = %v, want ErrInvalid for the field key", op, key, err)
			}
			if key != "" && len(key) < 80 && !strings.Contains(err.Error(), strconv.Quote(key)) {
				t.Errorf("%s(%q) error %q does not name the key", op, key, err)
			}
		}
	}
	if infos, err := s.List(ctx, ""); err != nil || len(infos) != 0 {
		t.Errorf("List after only bad Puts = %+v, %v; want nothing", infos, err)
	}
}

func testBadPrefixes(t *testing.T, b backend) {
	s := b.open(t)
	for _, prefix := range []string{"/", "/a", "a//", "a//b", "../", "a/../", "./", "a b", "a/b c", "ä", ".tmp/", strings.Repeat("a", MaxKeyLen+1)} {
		if _, err := s.List(t.Context(), prefix); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("List(%q) error = %v, want ErrInvalid", prefix, err)
		}
	}
}

func testMissingKeys(t *testing.T, b backend) {
	s := b.open(t)
	ctx := t.Context()
	mustPut(t, s, "file", []byte("x"), false)
	for _, key := range []string{"missing", "a/b/c", "file/below"} {
		_, statErr := s.Stat(ctx, key)
		_, getErr := s.Get(ctx, key)
		_, rangeErr := s.GetRange(ctx, key, 0, 1)
		_, emptyRangeErr := s.GetRange(ctx, key, 0, 0)
		for op, err := range map[string]error{"Stat": statErr, "Get": getErr, "GetRange": rangeErr, "GetRange(0 bytes)": emptyRangeErr} {
			if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), key) {
				t.Errorf("%s(%s) error = %v, want ErrNotFound naming the key", op, key, err)
			}
		}
	}
}

func testWrongSize(t *testing.T, b backend) {
	s := b.open(t)
	mustPut(t, s, "old", []byte("old content"), true)
	data := []byte("0123456789")
	for _, size := range []int64{0, 5, 9, 11, 100} {
		for _, key := range []string{"new", "old"} {
			err := s.Put(t.Context(), key, struct{ io.Reader }{bytes.NewReader(data)}, size)
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), strconv.FormatInt(size, 10)) {
				t.Errorf("Put(%s, 10 bytes, size %d) error = %v, want ErrInvalid naming the size", key, size, err)
			}
		}
	}
	checkNotFound(t, s, "new")
	checkContent(t, s, "old", []byte("old content"))
	checkNoLeftovers(t, b, s)
}

// failingReader returns some bytes and then an error.
type failingReader struct {
	data []byte
	err  error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if len(f.data) == 0 {
		return 0, f.err
	}
	n := copy(p, f.data)
	f.data = f.data[n:]
	return n, nil
}

func testReaderError(t *testing.T, b backend) {
	s := b.open(t)
	errBoom := errors.New("boom")
	for _, sz := range sizes {
		t.Run(sz.name, func(t *testing.T) {
			data := randomBytes(2, 100<<10)
			mustPut(t, s, "old", []byte("old content"), true)
			for _, key := range []string{"new", "old"} {
				r := &failingReader{data: data[:50<<10], err: errBoom}
				if err := s.Put(t.Context(), key, r, putSize(sz.known, data)); !errors.Is(err, errBoom) {
					t.Errorf("Put(%s) with a failing reader: error = %v, want the reader's", key, err)
				}
			}
			checkNotFound(t, s, "new")
			checkContent(t, s, "old", []byte("old content"))
		})
	}
	checkNoLeftovers(t, b, s)
}

// gatedReader hands out data[:gate], then blocks until release is closed before handing out the
// rest, so that a test can look at the store while a Put is halfway.
type gatedReader struct {
	data    []byte
	gate    int
	off     int
	reached chan struct{} // closed when the reader has handed out data[:gate] and is asked for more
	release chan struct{} // closed by the test
	once    sync.Once
}

func newGatedReader(data []byte, gate int) *gatedReader {
	return &gatedReader{data: data, gate: gate, reached: make(chan struct{}), release: make(chan struct{})}
}

func (g *gatedReader) Read(p []byte) (int, error) {
	if g.off == g.gate {
		g.once.Do(func() { close(g.reached) })
		<-g.release
	}
	if g.off == len(g.data) {
		return 0, io.EOF
	}
	end := len(g.data)
	if g.off < g.gate {
		end = g.gate
	}
	n := copy(p, g.data[g.off:end])
	g.off += n
	return n, nil
}

// startPut runs s.Put in a goroutine and returns its result channel.
func startPut(ctx context.Context, s Store, key string, r io.Reader, size int64) <-chan error {
	done := make(chan error, 1)
	go func() { done <- s.Put(ctx, key, r, size) }()
	return done
}

// waitGate waits until the Put has read up to the gate, failing if it ends first.
func waitGate(t *testing.T, g *gatedReader, done <-chan error) {
	t.Helper()
	select {
	case <-g.reached:
	case err := <-done:
		t.Fatalf("Put returned %v before reading the whole of its reader", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Put did not read up to the gate in 10s")
	}
}

func testAtomic(t *testing.T, b backend) {
	s := b.open(t)
	for _, sz := range sizes {
		for _, old := range []string{"", "the old object, which must be seen whole"} {
			name := sz.name + "/NoOld"
			if old != "" {
				name = sz.name + "/Old"
			}
			t.Run(name, func(t *testing.T) {
				key := "atomic/" + name
				if old != "" {
					mustPut(t, s, key, []byte(old), true)
				}
				data := randomBytes(3, 256<<10)
				g := newGatedReader(data, len(data)/2)
				done := startPut(t.Context(), s, key, g, putSize(sz.known, data))
				waitGate(t, g, done)

				// Halfway: the key shows the old object whole, or nothing.
				rc, err := s.Get(t.Context(), key)
				switch {
				case old == "" && !errors.Is(err, errdefs.ErrNotFound):
					t.Errorf("Get during the first Put: %v, want ErrNotFound", err)
				case old != "" && err != nil:
					t.Errorf("Get during a replacing Put: %v, want the old object", err)
				case old != "":
					got, err := io.ReadAll(rc)
					rc.Close()
					if err != nil || string(got) != old {
						t.Errorf("Get during a replacing Put = %.40q, %v; want the old object", got, err)
					}
				}
				info, err := s.Stat(t.Context(), key)
				if old == "" && !errors.Is(err, errdefs.ErrNotFound) || old != "" && (err != nil || info.Size != int64(len(old))) {
					t.Errorf("Stat during Put = %+v, %v; want the old object or ErrNotFound", info, err)
				}
				infos, err := s.List(t.Context(), "atomic/")
				for _, in := range infos {
					if in.Key == key && in.Size != int64(len(old)) {
						t.Errorf("List during Put: %+v; want the old object or nothing", in)
					}
				}
				if err != nil {
					t.Errorf("List during Put: %v", err)
				}

				close(g.release)
				if err := <-done; err != nil {
					t.Fatalf("Put: %v", err)
				}
				checkContent(t, s, key, data)
			})
		}
	}
	checkNoLeftovers(t, b, s)
}

func testConcurrentPuts(t *testing.T, b backend) {
	s := b.open(t)
	const writers = 6
	t.Run("SameContent", func(t *testing.T) {
		data := randomBytes(4, 512<<10)
		errs := make(chan error, writers)
		for i := range writers {
			go func() {
				// Half with the size, half without, so that S3 mixes PUT and multipart.
				errs <- s.Put(t.Context(), "same", struct{ io.Reader }{bytes.NewReader(data)}, putSize(i%2 == 0, data))
			}()
		}
		for range writers {
			if err := <-errs; err != nil {
				t.Errorf("concurrent Put of the same content: %v", err)
			}
		}
		checkContent(t, s, "same", data)
	})
	t.Run("DifferentContent", func(t *testing.T) {
		sums := map[[32]byte]bool{}
		errs := make(chan error, writers)
		for i := range writers {
			data := randomBytes(uint64(10+i), 256<<10+i)
			sums[sha256.Sum256(data)] = true
			go func() {
				errs <- s.Put(t.Context(), "different", struct{ io.Reader }{bytes.NewReader(data)}, putSize(i%2 == 0, data))
			}()
		}
		// Readers racing the writers see nothing or one writer's content whole.
		for range 20 {
			rc, err := s.Get(t.Context(), "different")
			if errors.Is(err, errdefs.ErrNotFound) {
				continue
			}
			if err != nil {
				t.Fatalf("Get during concurrent Puts: %v", err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || !sums[sha256.Sum256(got)] {
				t.Fatalf("Get during concurrent Puts: %d bytes, %v; want one writer's content whole", len(got), err)
			}
		}
		for range writers {
			if err := <-errs; err != nil {
				t.Errorf("concurrent Put of different content: %v", err)
			}
		}
		if got := mustGet(t, s, "different"); !sums[sha256.Sum256(got)] {
			t.Errorf("after concurrent Puts, Get = %d bytes that no writer wrote", len(got))
		}
	})
	checkNoLeftovers(t, b, s)
}

func testLarge(t *testing.T, b backend) {
	s := b.open(t)
	// Above the S3 part size, so both a streamed multipart upload and a sized one run.
	data := randomBytes(5, 20<<20)
	for _, sz := range sizes {
		t.Run(sz.name, func(t *testing.T) {
			key := "large/" + sz.name
			mustPut(t, s, key, data, sz.known)
			if got := mustGet(t, s, key); sha256.Sum256(got) != sha256.Sum256(data) {
				t.Fatalf("Get(%s) = %d bytes, not the %d put", key, len(got), len(data))
			}
			info, err := s.Stat(t.Context(), key)
			if err != nil || info.Size != int64(len(data)) {
				t.Errorf("Stat(%s) = %+v, %v; want size %d", key, info, err, len(data))
			}
			// A range across the boundary of the first part.
			const off, n = s3PartSize - 100, 300
			rc, err := s.GetRange(t.Context(), key, off, n)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || !bytes.Equal(got, data[off:off+n]) {
				t.Errorf("GetRange(%s, %d, %d) = %d bytes, %v; want the %d bytes there", key, off, n, len(got), err, n)
			}
		})
	}
	checkNoLeftovers(t, b, s)
}

func testCancelPut(t *testing.T, b backend) {
	s := b.open(t)
	mustPut(t, s, "old", []byte("old content"), true)
	for _, sz := range sizes {
		for _, key := range []string{"new", "old"} {
			t.Run(fmt.Sprintf("%s/%s", sz.name, key), func(t *testing.T) {
				data := randomBytes(6, 3<<20)
				g := newGatedReader(data, len(data)/2)
				ctx, cancel := context.WithCancel(t.Context())
				done := startPut(ctx, s, key, g, putSize(sz.known, data))
				waitGate(t, g, done)
				cancel()
				close(g.release)
				if err := <-done; !errors.Is(err, context.Canceled) {
					t.Errorf("Put cancelled halfway: error = %v, want context.Canceled", err)
				}
				if key == "new" {
					checkNotFound(t, s, key)
				} else {
					checkContent(t, s, key, []byte("old content"))
				}
				checkNoLeftovers(t, b, s)
			})
		}
	}
}
