package oci

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/corral-dev/corral/internal/errdefs"
)

func TestGroups(t *testing.T) {
	r := &Reader{}
	for i, size := range []int64{10, 20, 5, 100, 3, 3} {
		r.layers = append(r.layers, layer{index: i, size: size})
	}
	for _, tc := range []struct {
		threshold int64
		want      [][]int
	}{
		{30, [][]int{{0, 1}, {2}, {3}, {4, 5}}},
		{0, [][]int{{0}, {1}, {2}, {3}, {4}, {5}}},
		{1000, [][]int{{0, 1, 2, 3, 4, 5}}},
		{35, [][]int{{0, 1, 2}, {3}, {4, 5}}},
		{5, [][]int{{0}, {1}, {2}, {3}, {4}, {5}}},
		{6, [][]int{{0}, {1}, {2}, {3}, {4, 5}}},
	} {
		if got := r.Groups(tc.threshold); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Groups(%d) = %v, want %v", tc.threshold, got, tc.want)
		}
	}
	if got := (&Reader{}).Groups(10); got != nil {
		t.Errorf("Groups of no layers = %v, want nil", got)
	}
}

// groupLayers are three layers for the WriteGroup tests.
func groupLayers(t *testing.T) [][]byte {
	return [][]byte{
		tarOf(t, dir("base"), file("base/keep", "k"), file("base/gone", "g"),
			dir("y"), file("y/old", "o"), file("top", "t"), file("h", "H"), file("u/f", "f")),
		tarOf(t, dir("x"), file("x/a", "a"), file("x/b", "b"), file("x/c", "c"),
			dir("z"), file("z/1", "1"), whiteout("top"), file("x/l", "L"), hardlink("x/l2", "x/l"),
			file("u/f", "f2")),
		tarOf(t, whiteout("x/a"), whiteout("base/gone"), dir("y"), opaque("y"), file("y/new", "n"),
			whiteout("top"), file("x/c", "c2"), whiteout("z"), dir("z"), file("z/2", "2"),
			whiteout("x/l"), whiteout("u/f")),
	}
}

func TestWriteGroup(t *testing.T) {
	blobs := groupLayers(t)
	r := memReader(blobs...)

	// Layers 1 and 2: the whiteouts that hide something in layer 0 stay. x/a and x/l, created
	// by layer 1 and deleted by layer 2, are not in layer 0: their whiteouts go.
	diffTree(t, treeOf(t, writeGroup(t, r, 1, 2)), []string{
		".wh.top file ",
		"base/.wh.gone file ",
		"u/ dir 0755",
		"u/.wh.f file ",
		"x/ dir 0755",
		"x/b file b",
		"x/c file c2",
		"x/l2 file L",
		"y/ dir 0755",
		"y/.wh..wh..opq file ",
		"y/new file n",
		"z/ dir 0755",
		"z/.wh..wh..opq file ",
		"z/2 file 2",
	})

	// Layers 0 and 1: nothing is below, so no whiteouts.
	diffTree(t, treeOf(t, writeGroup(t, r, 0, 1)), []string{
		"base/ dir 0755",
		"base/gone file g",
		"base/keep file k",
		"h file H",
		"u/ dir 0755",
		"u/f file f2",
		"x/ dir 0755",
		"x/a file a",
		"x/b file b",
		"x/c file c",
		"x/l file L",
		"x/l2 hardlink x/l",
		"y/ dir 0755",
		"y/old file o",
		"z/ dir 0755",
		"z/1 file 1",
	})

	// A group of one layer: its whiteouts stay, and z, deleted and created again, is opaque.
	diffTree(t, treeOf(t, writeGroup(t, r, 2)), []string{
		".wh.top file ",
		"base/.wh.gone file ",
		"u/.wh.f file ",
		"x/ dir 0755",
		"x/.wh.a file ",
		"x/.wh.l file ",
		"x/c file c2",
		"y/ dir 0755",
		"y/.wh..wh..opq file ",
		"y/new file n",
		"z/ dir 0755",
		"z/.wh..wh..opq file ",
		"z/2 file 2",
	})
	// Layer 0 alone: as it is, directories first.
	diffTree(t, treeOf(t, writeGroup(t, r, 0)), []string{
		"base/ dir 0755", "base/gone file g", "base/keep file k", "h file H", "top file t",
		"u/ dir 0755", "u/f file f", "y/ dir 0755", "y/old file o",
	})

	for _, g := range [][]int{nil, {0, 2}, {1, 0}, {3}, {-1}} {
		if err := r.WriteGroup(context.Background(), g, &bytes.Buffer{}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("WriteGroup(%v) = %v, want ErrInvalid", g, err)
		}
	}
}

func TestWriteGroupLinkBelowGroup(t *testing.T) {
	r := memReader(
		tarOf(t, file("a", "A")),
		tarOf(t, hardlink("b", "a")),
		tarOf(t, file("c", "C")),
	)
	err := r.WriteGroup(context.Background(), []int{1, 2}, &bytes.Buffer{})
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), `hardlink target "a"`) {
		t.Errorf("WriteGroup = %v, want ErrInvalid naming the target", err)
	}
	diffTree(t, treeOf(t, writeGroup(t, r, 0, 1)), []string{"a file A", "b hardlink a"})
}

func TestFlattenEdgeCases(t *testing.T) {
	for _, tc := range []struct {
		name   string
		layers [][]byte
		want   []string
	}{{
		name: "root entry",
		layers: [][]byte{
			tarOf(t, dir("./"), file("./a", "a")),
			tarOf(t, ent{name: "./", typ: '5', mode: 0o700}),
		},
		want: []string{"./ dir 0700", "a file a"},
	}, {
		name: "opaque marker after entries of its own layer",
		layers: [][]byte{
			tarOf(t, dir("d"), dir("d/x"), file("d/x/old", "o"), file("d/f", "f")),
			tarOf(t, file("d/x/new", "n"), opaque("d")),
		},
		// d/x was not listed by layer 1: it is the implicit parent of d/x/new.
		want: []string{"d/ dir 0755", "d/x/ dir 0755", "d/x/new file n"},
	}, {
		name: "AUFS hardlink directory",
		layers: [][]byte{
			tarOf(t, dir(".wh..wh.plnk"), file(".wh..wh.plnk/123.45", "P"), dir("usr"),
				hardlink("usr/a", ".wh..wh.plnk/123.45"), hardlink("usr/b", ".wh..wh.plnk/123.45"),
				file(".wh..wh.aufs", "")),
		},
		want: []string{"usr/ dir 0755", "usr/a file P", "usr/b hardlink usr/a"},
	}, {
		name: "whiteout of a directory and everything below",
		layers: [][]byte{
			tarOf(t, dir("a"), dir("a/b"), file("a/b/c", "c"), file("a/d", "d")),
			tarOf(t, whiteout("a"), whiteout("nothing/here")),
		},
		want: nil,
	}, {
		name: "entry below a deleted directory",
		layers: [][]byte{
			tarOf(t, dir("a"), file("a/old", "o")),
			tarOf(t, whiteout("a"), file("a/new", "n")),
		},
		want: []string{"a/ dir 0755", "a/new file n"},
	}, {
		name: "a file replaced twice, hardlinked in between",
		layers: [][]byte{
			tarOf(t, file("f", "1"), hardlink("g", "f"), file("f", "2")),
		},
		want: []string{"f file 2", "g file 1"},
	}, {
		name: "a whiteout does not hide an entry of its own layer",
		layers: [][]byte{
			tarOf(t, file("f", "1")),
			tarOf(t, file("f", "2"), whiteout("f")),
		},
		want: []string{"f file 2"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			diffTree(t, treeOf(t, flatten(t, memReader(tc.layers...))), tc.want)
		})
	}
}

func TestFlattenRefuses(t *testing.T) {
	big := bytes.Repeat([]byte{0}, maxTrailing+2048)
	for _, tc := range []struct {
		name   string
		layers [][]byte
		want   string
	}{
		{"absolute name", [][]byte{tarOf(t, file("/etc/passwd", "x"))}, "absolute path"},
		{"dot-dot", [][]byte{tarOf(t, file("a/../../b", "x"))}, `".." path component`},
		{"entry below a file", [][]byte{tarOf(t, file("a", "x")), tarOf(t, file("a/b", "y"))}, "a parent is not a directory"},
		{"entry below a symlink", [][]byte{tarOf(t, symlink("lib", "/usr/lib")), tarOf(t, file("lib/x", "y"))}, "a parent is not a directory"},
		{"hardlink to nothing", [][]byte{tarOf(t, hardlink("b", "a"))}, `hardlink target "a"`},
		{"hardlink to a directory", [][]byte{tarOf(t, dir("d"), hardlink("b", "d"))}, `hardlink target "d"`},
		{"not a tar", [][]byte{[]byte("this is not a tar archive, not at all, not even close to one; " + strings.Repeat("x", 600))}, "layer 0"},
		{"xz", [][]byte{{0xfd, '7', 'z', 'X', 'Z', 0, 1, 2}}, "xz"},
		{"trailing data", [][]byte{append(tarOf(t, file("a", "x")), append(big, 1)...)}, "follow the end of the tar archive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := memReader(tc.layers...).Flatten(context.Background(), &bytes.Buffer{})
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Flatten = %v, want ErrInvalid saying %q", err, tc.want)
			}
		})
	}
}

func TestFlattenChecksDiffID(t *testing.T) {
	r := memReader(tarOf(t, file("a", "x")))
	r.layers[0].diffID = v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("0", 64)}
	r.layers[0].digest = v1.Hash{}
	err := r.Flatten(context.Background(), &bytes.Buffer{})
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "diff_id") {
		t.Errorf("Flatten = %v, want ErrInvalid about the diff_id", err)
	}
}

func TestFlattenZstd(t *testing.T) {
	plain := tarOf(t, file("a", strings.Repeat("zstd ", 1000)))
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	blob := enc.EncodeAll(plain, nil)
	r := memReader(blob)
	sum := sha256.Sum256(plain)
	r.layers[0].diffID = v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
	diffTree(t, treeOf(t, flatten(t, r)), []string{"a file " + strings.Repeat("zstd ", 1000)})
}

func TestFlattenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := memReader(tarOf(t, file("a", "x"))).Flatten(ctx, &bytes.Buffer{})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Flatten = %v, want context.Canceled", err)
	}
}
