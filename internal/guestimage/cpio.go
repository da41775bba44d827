package guestimage

import (
	"fmt"
	"io"
)

// The initramfs is a cpio archive in the "newc" format the kernel unpacks
// (https://docs.kernel.org/driver-api/early-userspace/buffer-format.html): per entry the magic
// "070701", 13 fields of 8 hex digits, the name with its NUL padded to 4 bytes, then the data padded
// to 4 bytes; a "TRAILER!!!" entry ends the archive.

// File type bits of a cpio mode (as in stat's st_mode).
const (
	modeDir     = 0o040000
	modeRegular = 0o100000
	modeCharDev = 0o020000
)

const (
	cpioMagic      = "070701"
	cpioHeaderSize = 6 + 13*8
	cpioTrailer    = "TRAILER!!!"
)

// cpioWriter writes a newc archive with reproducible headers: uid, gid and mtime are 0 and inode
// numbers count up from 1 in the order entries are written. It does not sort: the caller writes
// parents before children. After the first error every call returns it.
type cpioWriter struct {
	w   io.Writer
	ino uint32
	err error
}

func newCPIOWriter(w io.Writer) *cpioWriter { return &cpioWriter{w: w} }

// dir writes a directory entry; perm holds the permission bits only.
func (c *cpioWriter) dir(name string, perm uint32) error {
	return c.entry(name, modeDir|perm, 2, 0, 0, nil)
}

// file writes a regular file.
func (c *cpioWriter) file(name string, perm uint32, data []byte) error {
	return c.entry(name, modeRegular|perm, 1, 0, 0, data)
}

// charDev writes a character device node.
func (c *cpioWriter) charDev(name string, perm, major, minor uint32) error {
	return c.entry(name, modeCharDev|perm, 1, major, minor, nil)
}

// close writes the trailer, whose fields are all zero. It does not close the underlying writer.
func (c *cpioWriter) close() error {
	if c.err != nil {
		return c.err
	}
	return c.entryIno(0, cpioTrailer, 0, 0, 0, 0, nil)
}

func (c *cpioWriter) entry(name string, mode, nlink, rmajor, rminor uint32, data []byte) error {
	if c.err != nil {
		return c.err
	}
	if name == "" || name == cpioTrailer || name[0] == '/' {
		c.err = fmt.Errorf("cpio: bad entry name %q", name)
		return c.err
	}
	c.ino++
	return c.entryIno(c.ino, name, mode, nlink, rmajor, rminor, data)
}

func (c *cpioWriter) entryIno(ino uint32, name string, mode, nlink, rmajor, rminor uint32, data []byte) error {
	if uint64(len(data)) > 0xffffffff || len(name)+1 > 0xffffffff {
		c.err = fmt.Errorf("cpio: entry %q is too large for newc", name)
		return c.err
	}
	hdr := fmt.Sprintf("%s%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		cpioMagic,
		ino, mode, 0, 0, nlink, 0, // ino, mode, uid, gid, nlink, mtime
		len(data), 0, 0, rmajor, rminor, // filesize, devmajor, devminor, rdevmajor, rdevminor
		len(name)+1, 0) // namesize (with the NUL), check
	buf := make([]byte, 0, pad4(cpioHeaderSize+len(name)+1))
	buf = append(buf, hdr...)
	buf = append(buf, name...)
	buf = append(buf, 0)
	buf = append(buf, make([]byte, pad4(len(buf))-len(buf))...)
	if _, err := c.w.Write(buf); err != nil {
		c.err = err
		return err
	}
	if len(data) > 0 {
		if _, err := c.w.Write(data); err != nil {
			c.err = err
			return err
		}
		if p := pad4(len(data)) - len(data); p > 0 {
			if _, err := c.w.Write(make([]byte, p)); err != nil {
				c.err = err
				return err
			}
		}
	}
	return nil
}

// pad4 rounds n up to a multiple of 4.
func pad4(n int) int { return (n + 3) &^ 3 }
