//go:build linux

package lazy

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"github.com/corral-dev/corral/internal/chunkcache"
	"github.com/corral-dev/corral/internal/errdefs"
)

// Chunk is one content-addressed piece of a layer's data blob: Len bytes at Off whose SHA-256 is
// Sum. A table's chunks are contiguous and cover the blob.
type Chunk struct {
	Off, Len int64
	Sum      [32]byte
}

// Table maps a layer's data blob to its chunks. It is written by the importing node next to the
// layer's metadata image and read by every node that mounts the layer.
type Table struct {
	// DataKey is the blob store key of the data blob; DataSize its length in bytes.
	DataKey  string
	DataSize int64
	// ChunkSize is the largest chunk the import cut (mkfs.erofs --chunksize).
	ChunkSize int64
	Chunks    []Chunk
}

// Limits on a table, so that a corrupt or hostile one cannot make a node allocate without bound.
const (
	maxChunks   = 1 << 22
	maxChunkLen = chunkcache.MaxChunkSize
)

// tableJSON is a table's file form; chunks are [offset, length, "hex sha256"] triples.
type tableJSON struct {
	Version   int               `json:"version"`
	DataKey   string            `json:"data_key"`
	DataSize  int64             `json:"data_size"`
	ChunkSize int64             `json:"chunk_size"`
	Chunks    []json.RawMessage `json:"chunks"`
}

type chunkJSON struct {
	Off int64  `json:"o"`
	Len int64  `json:"l"`
	Sum string `json:"s"`
}

// MarshalJSON writes the table's file form.
func (t *Table) MarshalJSON() ([]byte, error) {
	out := tableJSON{Version: 1, DataKey: t.DataKey, DataSize: t.DataSize, ChunkSize: t.ChunkSize,
		Chunks: make([]json.RawMessage, len(t.Chunks))}
	for i, c := range t.Chunks {
		b, err := json.Marshal(chunkJSON{c.Off, c.Len, hex.EncodeToString(c.Sum[:])})
		if err != nil {
			return nil, err
		}
		out.Chunks[i] = b
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads a table's file form and checks it (see Check).
func (t *Table) UnmarshalJSON(b []byte) error {
	var in tableJSON
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	if in.Version != 1 {
		return errdefs.Invalid("table", "version %d is not understood (this Corral reads version 1)", in.Version)
	}
	if len(in.Chunks) > maxChunks {
		return errdefs.Invalid("table", "%d chunks; the limit is %d", len(in.Chunks), maxChunks)
	}
	*t = Table{DataKey: in.DataKey, DataSize: in.DataSize, ChunkSize: in.ChunkSize, Chunks: make([]Chunk, len(in.Chunks))}
	for i, raw := range in.Chunks {
		var c chunkJSON
		if err := json.Unmarshal(raw, &c); err != nil {
			return fmt.Errorf("chunk %d: %w", i, err)
		}
		sum, err := hex.DecodeString(c.Sum)
		if err != nil || len(sum) != 32 {
			return errdefs.Invalid("table", "chunk %d: %q is not a hex SHA-256", i, c.Sum)
		}
		t.Chunks[i] = Chunk{Off: c.Off, Len: c.Len}
		copy(t.Chunks[i].Sum[:], sum)
	}
	return t.Check()
}

// Check reports whether the chunks are non-empty, at most chunkcache.MaxChunkSize each, contiguous from offset 0
// and end exactly at DataSize.
func (t *Table) Check() error {
	if t.DataKey == "" {
		return errdefs.Invalid("table", "no data key")
	}
	var off int64
	for i, c := range t.Chunks {
		if c.Off != off || c.Len <= 0 || c.Len > maxChunkLen {
			return errdefs.Invalid("table", "chunk %d is [%d,+%d); expected a non-empty chunk of at most %d bytes at %d", i, c.Off, c.Len, maxChunkLen, off)
		}
		off += c.Len
	}
	if off != t.DataSize {
		return errdefs.Invalid("table", "chunks cover %d bytes; the data blob has %d", off, t.DataSize)
	}
	return nil
}

// find returns the index of the chunk holding byte off (0 <= off < DataSize).
func (t *Table) find(off int64) int {
	return sort.Search(len(t.Chunks), func(i int) bool { return t.Chunks[i].Off+t.Chunks[i].Len > off })
}

// ReadTable reads and checks a table file.
func ReadTable(path string) (*Table, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	t := new(Table)
	if err := json.Unmarshal(b, t); err != nil {
		return nil, fmt.Errorf("read chunk table %s: %w", path, err)
	}
	return t, nil
}
