//go:build linux

package erofs

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"slices"

	goerofs "github.com/erofs/go-erofs"

	"github.com/corral-dev/corral/internal/errdefs"
)

// MaxChunks is the most units Chunks returns; a blob that would need more is refused. At the
// smallest chunk size it allows a 16 GiB blob.
const MaxChunks = 1 << 22

// A Chunk is one content-addressed unit of a data blob: the bytes [Off, Off+Len) of the blob,
// whose SHA-256 is Sum.
type Chunk struct {
	Off, Len int64
	Sum      [32]byte
}

// Chunks cuts the data blob written by BuildSplit into content-addressed units, reading the
// image's chunk indexes from meta. chunkSize must be the one the image was built with.
//
// The units are in blob order, contiguous, and cover the whole blob: the first starts at 0 and
// the last ends at its size. A unit starts wherever a chunk of some file starts (each multiple of
// chunkSize in the file, mapped to the blob; holes have no place in the blob and are skipped;
// deduplicated chunks are one place). Between those points, consecutive pieces are merged while
// the unit stays within chunkSize, so a file's tail and the small files after it share a unit,
// while every full chunk (exactly chunkSize bytes) is a unit of its own. That is what makes units
// content-addressed across images: a file stored in two layers gives the same Sums for its full
// chunks in both, wherever it lies in each blob. No unit is longer than chunkSize; a piece longer
// than that, which mkfs.erofs does not write, is cut into chunkSize units from its start. Each
// unit's bytes include the padding after the data in it, which mkfs.erofs fills with zeros, so a
// unit's Sum is a function of its content.
//
// An empty blob (a tree with no regular-file data) gives no units. An image whose chunk indexes
// do not fit the blob (an extent past its end, a blob size other than the image's record of it,
// a chunk index Chunks cannot read, more than MaxChunks units, or extents that show the image was
// built with a chunk size smaller than chunkSize) wraps errdefs.ErrInvalid.
func Chunks(ctx context.Context, meta, data string, chunkSize int64) ([]Chunk, error) {
	cs, err := chunks(ctx, meta, data, chunkSize)
	if err != nil {
		return nil, fmt.Errorf("chunk erofs data blob %s of %s: %w", data, meta, err)
	}
	return cs, nil
}

func chunks(ctx context.Context, meta, data string, chunkSize int64) ([]Chunk, error) {
	if chunkSize < MinChunkSize || chunkSize > MaxChunkSize || chunkSize&(chunkSize-1) != 0 {
		return nil, fmt.Errorf("chunk size %d is not a power of two from %d to %d: %w",
			chunkSize, MinChunkSize, MaxChunkSize, errdefs.ErrInvalid)
	}
	mf, err := os.Open(meta)
	if err != nil {
		return nil, err
	}
	defer mf.Close()
	df, err := os.Open(data)
	if err != nil {
		return nil, err
	}
	defer df.Close()
	mst, err := mf.Stat()
	if err != nil {
		return nil, err
	}
	dst, err := df.Stat()
	if err != nil {
		return nil, err
	}
	size := dst.Size()

	sb, err := readSuper(mf)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrInvalid)
	}
	if len(sb.devices) != 1 {
		return nil, fmt.Errorf("image has %d extra devices, not the 1 of a split image: %w", len(sb.devices), errdefs.ErrInvalid)
	}
	if want := sb.devices[0].size(sb.blkBits); size != want {
		return nil, fmt.Errorf("data blob is %d bytes; the image records %d: %w", size, want, errdefs.ErrInvalid)
	}
	fsys, err := goerofs.Open(mf, goerofs.WithExtraDevices(df))
	if err != nil {
		return nil, fmt.Errorf("open image: %w: %w", err, errdefs.ErrInvalid)
	}

	// starts holds every blob offset where a file's chunk starts.
	starts := map[int64]struct{}{0: {}}
	seen := map[uint64]bool{} // inodes done: hardlinks share their chunks
	err = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if ino, ok := fi.(interface{ Ino() uint64 }); ok {
			if seen[ino.Ino()] {
				return nil
			}
			seen[ino.Ino()] = true
		}
		if fi.Size() == 0 {
			return nil
		}
		dr, ok := fi.(interface{ DataRange() []goerofs.DataRange })
		var ranges []goerofs.DataRange
		if ok {
			ranges = dr.DataRange()
		}
		if len(ranges) == 0 {
			return fmt.Errorf("%s: no chunk index that can be read: %w", p, errdefs.ErrInvalid)
		}
		var pos int64 // logical offset in the file
		for _, r := range ranges {
			switch {
			case r.Size <= 0 || r.Size > fi.Size()-pos:
				return fmt.Errorf("%s: extent of %d bytes at file offset %d past its size %d: %w", p, r.Size, pos, fi.Size(), errdefs.ErrInvalid)
			case r.Offset == -1: // a hole: nothing stored
			case r.Device == 0:
				// Data in the image itself (mkfs.erofs puts none there with --blobdev).
				if r.Offset < 0 || r.Offset > mst.Size()-r.Size {
					return fmt.Errorf("%s: extent [%d, +%d) past the end of the image: %w", p, r.Offset, r.Size, errdefs.ErrInvalid)
				}
			case r.Device != 1:
				return fmt.Errorf("%s: extent on device %d; the image has one: %w", p, r.Device, errdefs.ErrInvalid)
			case r.Offset < 0 || r.Offset > size-r.Size:
				return fmt.Errorf("%s: extent [%d, +%d) past the end of the %d-byte data blob: %w", p, r.Offset, r.Size, size, errdefs.ErrInvalid)
			case pos%chunkSize != 0:
				// The extents of a chunk-indexed file break only between chunks.
				return fmt.Errorf("%s: extent at file offset %d, not a multiple of chunk size %d (was the image built with a smaller one?): %w",
					p, pos, chunkSize, errdefs.ErrInvalid)
			default:
				for o := int64(0); o < r.Size; o += chunkSize {
					starts[r.Offset+o] = struct{}{}
				}
				if len(starts) > MaxChunks {
					return fmt.Errorf("more than %d chunks: %w", MaxChunks, errdefs.ErrInvalid)
				}
			}
			pos += r.Size
		}
		if pos != fi.Size() {
			return fmt.Errorf("%s: extents cover %d of its %d bytes: %w", p, pos, fi.Size(), errdefs.ErrInvalid)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if size == 0 {
		return nil, nil
	}

	units, err := cutUnits(slices.Sorted(maps.Keys(starts)), size, chunkSize)
	if err != nil {
		return nil, err
	}
	r := bufio.NewReaderSize(&ctxReader{ctx: ctx, r: io.NewSectionReader(df, 0, size)}, 1<<20)
	h := sha256.New()
	for i := range units {
		h.Reset()
		if _, err := io.CopyN(h, r, units[i].Len); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("read data blob at %d: %w", units[i].Off, err)
		}
		h.Sum(units[i].Sum[:0])
	}
	return units, nil
}

// cutUnits turns the sorted start offsets (the first 0, all below size) into units covering
// [0, size): the pieces between consecutive starts, merged greedily up to chunkSize, and cut into
// chunkSize units where one piece is longer. Sums are left zero.
func cutUnits(starts []int64, size, chunkSize int64) ([]Chunk, error) {
	var units []Chunk
	var cur Chunk // the unit being built; Len 0 when there is none
	add := func(c Chunk) error {
		if len(units) == MaxChunks {
			return fmt.Errorf("more than %d chunks: %w", MaxChunks, errdefs.ErrInvalid)
		}
		units = append(units, c)
		return nil
	}
	for i, off := range starts {
		end := size
		if i+1 < len(starts) {
			end = starts[i+1]
		}
		n := end - off
		if cur.Len > 0 && cur.Len+n > chunkSize {
			if err := add(cur); err != nil {
				return nil, err
			}
			cur = Chunk{}
		}
		if cur.Len == 0 {
			cur.Off = off
		}
		cur.Len += n
		for cur.Len > chunkSize { // a piece longer than a chunk
			if err := add(Chunk{Off: cur.Off, Len: chunkSize}); err != nil {
				return nil, err
			}
			cur.Off += chunkSize
			cur.Len -= chunkSize
		}
	}
	if cur.Len > 0 {
		if err := add(cur); err != nil {
			return nil, err
		}
	}
	return units, nil
}

// Superblock fields this package reads beyond setUUID's (erofs_fs.h).
const (
	sbIncompatOff     = sbOffset + 80
	sbExtraDevicesOff = sbOffset + 86
	sbDevtSlotOffOff  = sbOffset + 88
	devtSlotSize      = 128        // struct erofs_deviceslot
	featIncompat48Bit = 0x00000080 // EROFS_FEATURE_INCOMPAT_48BIT: device slots have high words
	maxExtraDevices   = 256        // more than any image of ours has; bounds what a corrupt one costs
)

// superInfo is what Mount and Chunks need from an EROFS superblock.
type superInfo struct {
	blkBits uint8
	devices []deviceSlot // the extra devices, in order (device IDs 1, 2, ...)
}

// deviceSlot is one entry of the device table.
type deviceSlot struct {
	blocks  uint64 // the device's size in blocks
	uniaddr uint64 // its first block in the unified address space: where it sits in a flat image
}

func (d deviceSlot) size(blkBits uint8) int64 { return int64(d.blocks) << blkBits }

// readSuper reads the block size and the device table of the EROFS image in r.
func readSuper(r io.ReaderAt) (superInfo, error) {
	sb := make([]byte, 128)
	if _, err := r.ReadAt(sb, sbOffset); err != nil {
		return superInfo{}, fmt.Errorf("read superblock: %w", err)
	}
	le := binary.LittleEndian
	if m := le.Uint32(sb); m != sbMagic {
		return superInfo{}, fmt.Errorf("read superblock: bad magic %#x", m)
	}
	si := superInfo{blkBits: sb[sbBlkSzBitsOff-sbOffset]}
	if si.blkBits < 9 || si.blkBits > 16 {
		return superInfo{}, fmt.Errorf("read superblock: unsupported block size 2^%d", si.blkBits)
	}
	n := int(le.Uint16(sb[sbExtraDevicesOff-sbOffset:]))
	if n == 0 {
		return si, nil
	}
	if n > maxExtraDevices {
		return superInfo{}, fmt.Errorf("read superblock: %d extra devices", n)
	}
	wide := le.Uint32(sb[sbIncompatOff-sbOffset:])&featIncompat48Bit != 0
	table := make([]byte, n*devtSlotSize)
	if _, err := r.ReadAt(table, int64(le.Uint16(sb[sbDevtSlotOffOff-sbOffset:]))*devtSlotSize); err != nil {
		return superInfo{}, fmt.Errorf("read device table: %w", err)
	}
	for i := range n {
		s := table[i*devtSlotSize:]
		d := deviceSlot{blocks: uint64(le.Uint32(s[64:])), uniaddr: uint64(le.Uint32(s[68:]))}
		if wide {
			d.blocks |= uint64(le.Uint32(s[72:])) << 32
			d.uniaddr |= uint64(le.Uint16(s[76:])) << 32
		}
		if d.blocks > 1<<(61-si.blkBits) || d.uniaddr > 1<<(61-si.blkBits) {
			return superInfo{}, fmt.Errorf("read device table: device %d: %d blocks at %d", i+1, d.blocks, d.uniaddr)
		}
		si.devices = append(si.devices, d)
	}
	return si, nil
}
