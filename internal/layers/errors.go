//go:build linux

package layers

import (
	"errors"
	"fmt"
	"strconv"
	"syscall"

	"github.com/corral-dev/corral/internal/errdefs"
)

// rejectError says why an archive was refused. It wraps errdefs.ErrInvalid or errdefs.ErrTooLarge
// so the API maps it to 400 or 413; its message is meant for the user who sent the archive.
type rejectError struct {
	entry  string // the entry's name as written in the archive; "" when the archive as a whole is at fault
	reason string
	kind   error
}

func (e *rejectError) Error() string {
	if e.entry == "" {
		return e.reason
	}
	name := e.entry
	if len(name) > 160 { // names may be 4 KiB; keep the message readable
		name = name[:100] + "..." + name[len(name)-40:]
	}
	return "entry " + strconv.Quote(name) + ": " + e.reason
}

func (e *rejectError) Unwrap() error { return e.kind }

// invalidEntry refuses one entry of an archive.
func invalidEntry(entry, format string, args ...any) error {
	return &rejectError{entry: entry, reason: fmt.Sprintf(format, args...), kind: errdefs.ErrInvalid}
}

// tooLargeEntry refuses an entry that takes the layer past a limit.
func tooLargeEntry(entry, format string, args ...any) error {
	return &rejectError{entry: entry, reason: fmt.Sprintf(format, args...), kind: errdefs.ErrTooLarge}
}

// invalidArchive refuses the archive as a whole.
func invalidArchive(format string, args ...any) error {
	return &rejectError{reason: fmt.Sprintf(format, args...), kind: errdefs.ErrInvalid}
}

// tooLargeArchive refuses the archive as a whole for exceeding a limit.
func tooLargeArchive(format string, args ...any) error {
	return &rejectError{reason: fmt.Sprintf(format, args...), kind: errdefs.ErrTooLarge}
}

// isNoSpace reports whether err means the filesystem or a quota is full.
func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}
