// Package vmdisk inspects the disk images of vm sandboxes (layers of kind vm-image): a raw
// image, or a qcow2 image that QEMU can open without touching any other file.
//
// A qcow2 header can name a backing file or an external data file by path; QEMU would open that
// path on the host as the VM's QEMU process. An image that names either is refused here, and the
// runtime also opens every image with its backing set to none (internal/runtime/qemu).
package vmdisk

import (
	"encoding/binary"
	"io"
	"os"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Formats of Info.Format.
const (
	QCOW2 = "qcow2"
	Raw   = "raw"
)

// The file a vm-image layer holds, one of the two by its format (the API's corral.VMDiskQCOW2
// and corral.VMDiskRaw: TestFileNames keeps them equal).
const (
	FileQCOW2 = "disk.qcow2"
	FileRaw   = "disk.raw"
)

// FileName is the layer's file name for an image of format.
func FileName(format string) string {
	if format == Raw {
		return FileRaw
	}
	return FileQCOW2
}

// Bounds of an image.
const (
	// MaxVirtualBytes bounds the disk a guest sees (1 TiB).
	MaxVirtualBytes = 1 << 40
	// MinVirtualBytes: a disk smaller than 1 MiB holds no bootable system.
	MinVirtualBytes = 1 << 20
)

// Info describes a disk image.
type Info struct {
	Format string
	// VirtualBytes is the size of the disk the guest sees.
	VirtualBytes int64
}

// qcow2 header fields (QEMU's docs/interop/qcow2.txt), big-endian.
const (
	qcowMagic         = 0x514649fb // "QFI\xfb"
	qcowHeaderV2      = 72
	incompatDataFile  = 1 << 2 // external data file
	incompatKnownMask = 0x1f   // dirty, corrupt, data file, compression type, extended L2
)

// Inspect reads the image at path as format (QCOW2 or Raw) and checks that QEMU can use it as a
// vm sandbox's base disk: a raw file of at least MinVirtualBytes, or a qcow2 image (version 2
// or 3) without a backing file, an external data file or encryption, not marked corrupt, with a
// virtual size within the bounds.
func Inspect(path, format string) (Info, error) {
	f, err := os.Open(path)
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Info{}, err
	}
	if !fi.Mode().IsRegular() {
		return Info{}, errdefs.Invalid("image", "%s is not a regular file", path)
	}
	switch format {
	case Raw:
		n := fi.Size()
		if n < MinVirtualBytes || n > MaxVirtualBytes {
			return Info{}, errdefs.Invalid("image", "a raw disk of %d bytes: want %d to %d", n, int64(MinVirtualBytes), int64(MaxVirtualBytes))
		}
		if n%512 != 0 {
			return Info{}, errdefs.Invalid("image", "a raw disk of %d bytes: not a multiple of 512-byte sectors", n)
		}
		return Info{Format: Raw, VirtualBytes: n}, nil
	case QCOW2:
		return inspectQCOW2(f)
	}
	return Info{}, errdefs.Invalid("format", "%q: want qcow2 or raw", format)
}

func inspectQCOW2(r io.ReaderAt) (Info, error) {
	h := make([]byte, 104)
	n, err := r.ReadAt(h, 0)
	if n < qcowHeaderV2 {
		if err == nil || err == io.EOF {
			return Info{}, errdefs.Invalid("image", "not a qcow2 image: %d bytes, shorter than a header", n)
		}
		return Info{}, err
	}
	be := binary.BigEndian
	if be.Uint32(h[0:]) != qcowMagic {
		return Info{}, errdefs.Invalid("image", "not a qcow2 image (bad magic %#x)", be.Uint32(h[0:]))
	}
	version := be.Uint32(h[4:])
	if version != 2 && version != 3 {
		return Info{}, errdefs.Invalid("image", "qcow2 version %d: want 2 or 3", version)
	}
	if off, size := be.Uint64(h[8:]), be.Uint32(h[16:]); off != 0 || size != 0 {
		return Info{}, errdefs.Invalid("image", "the qcow2 image names a backing file: a vm image must stand alone (qemu-img convert -O qcow2 flattens it)")
	}
	clusterBits := be.Uint32(h[20:])
	if clusterBits < 9 || clusterBits > 21 {
		return Info{}, errdefs.Invalid("image", "qcow2 cluster_bits %d: want 9 to 21", clusterBits)
	}
	size := be.Uint64(h[24:])
	if size < MinVirtualBytes || size > MaxVirtualBytes {
		return Info{}, errdefs.Invalid("image", "qcow2 virtual size %d bytes: want %d to %d", size, int64(MinVirtualBytes), int64(MaxVirtualBytes))
	}
	if method := be.Uint32(h[32:]); method != 0 {
		return Info{}, errdefs.Invalid("image", "the qcow2 image is encrypted (method %d): not supported", method)
	}
	if version == 3 {
		if n < 104 {
			return Info{}, errdefs.Invalid("image", "qcow2 version 3 header cut short (%d bytes)", n)
		}
		incompat := be.Uint64(h[72:])
		if incompat&incompatDataFile != 0 {
			return Info{}, errdefs.Invalid("image", "the qcow2 image uses an external data file: a vm image must stand alone")
		}
		if incompat&2 != 0 {
			return Info{}, errdefs.Invalid("image", "the qcow2 image is marked corrupt (qemu-img check -r all repairs it)")
		}
		if incompat&^incompatKnownMask != 0 {
			return Info{}, errdefs.Invalid("image", "the qcow2 image has incompatible features %#x this QEMU may not know", incompat)
		}
	}
	return Info{Format: QCOW2, VirtualBytes: int64(size)}, nil
}
