// Package mountinfo reads this process's mount table (/proc/self/mountinfo): the mount points at
// or below a directory, and the kernel's escaping of the paths in it. It is the one reader the
// runtime, LXCFS supervisor, layer mounts and benchmarks share.
package mountinfo

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Under returns the mount points at or below dir in this mount namespace, deepest first and,
// at one depth, latest first (a stack's top comes later in mountinfo): the order to unmount them.
func Under(dir string) ([]string, error) {
	ms, err := UnderAny(dir)
	mps := make([]string, len(ms))
	for i, m := range ms {
		mps[i] = m.Point
	}
	return mps, err
}

// Mount is one mount of the table: its mount point and its source (a device such as
// /dev/loop3, or what the filesystem was given).
type Mount struct {
	Point, Source string
}

// UnderAny returns the mounts at or below any of dirs, in Under's order, from one read of the
// table.
func UnderAny(dirs ...string) ([]Mount, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	var ms []Mount
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		mp := Unescape(f[4])
		if !slices.ContainsFunc(dirs, func(dir string) bool { return mp == dir || strings.HasPrefix(mp, dir+"/") }) {
			continue
		}
		m := Mount{Point: mp}
		// Optional fields end at "-"; the filesystem type and the source follow.
		if i := slices.Index(f[5:], "-"); i >= 0 && 5+i+2 < len(f) {
			m.Source = Unescape(f[5+i+2])
		}
		ms = append(ms, m)
	}
	slices.Reverse(ms)
	slices.SortStableFunc(ms, func(a, b Mount) int { return strings.Count(b.Point, "/") - strings.Count(a.Point, "/") })
	return ms, sc.Err()
}

// IsMountpoint reports whether dir is a mount point in this mount namespace.
func IsMountpoint(dir string) bool {
	mps, err := Under(dir)
	return err == nil && slices.Contains(mps, dir)
}

// Unescape undoes mountinfo's octal escapes (\040 for a space, \134 for a backslash).
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
