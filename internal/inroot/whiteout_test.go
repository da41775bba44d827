package inroot

import "golang.org/x/sys/unix"

// unixMknodWhiteout makes an overlay whiteout (a 0/0 character device); it needs CAP_MKNOD.
func unixMknodWhiteout(p string) error { return unix.Mknod(p, unix.S_IFCHR, 0) }
