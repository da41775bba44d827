package vmlink

import (
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// TakeStdio makes the calling process's stdin and stdout the guest's end of the link, for Listen:
// a gVisor sandbox's agent reads the host's bytes on its stdin and writes its own on its stdout,
// a pair of pipes whose host ends Hold serves. Both are moved to close-on-exec descriptors above
// 2, and /dev/null takes their places, so no command the agent starts can inherit the link. The
// returned open function returns the same port every time: the pipes cannot be reopened, and
// need not be, since they have deadlines (a session ends without closing them).
func TakeStdio() (func() (io.ReadWriteCloser, error), error) {
	r, err := takeFD(0, "stdin")
	if err != nil {
		return nil, err
	}
	w, err := takeFD(1, "stdout")
	if err != nil {
		r.Close()
		return nil, err
	}
	null, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("open /dev/null: %w", err)
	}
	for _, fd := range []int{0, 1} {
		if err := unix.Dup3(null, fd, 0); err != nil {
			unix.Close(null)
			r.Close()
			w.Close()
			return nil, fmt.Errorf("replace fd %d: %w", fd, err)
		}
	}
	unix.Close(null)
	p := &pipePort{r: r, w: w}
	return func() (io.ReadWriteCloser, error) { return p, nil }, nil
}

// takeFD duplicates fd to a close-on-exec, non-blocking descriptor in Go's poller.
func takeFD(fd int, name string) (*os.File, error) {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return nil, fmt.Errorf("take %s: %w", name, err)
	}
	if err := unix.SetNonblock(nfd, true); err != nil {
		unix.Close(nfd)
		return nil, fmt.Errorf("take %s: %w", name, err)
	}
	return os.NewFile(uintptr(nfd), name), nil
}

// pipePort is a port made of two pipes. Close only releases blocked reads and writes (it sets
// both deadlines in the past): the pipes stay open, since nothing could open them again, and
// Listen clears the deadlines whenever it takes the port (again).
type pipePort struct{ r, w *os.File }

// Read reads the host's bytes.
func (p *pipePort) Read(b []byte) (int, error) { return p.r.Read(b) }

// Write writes bytes for the host.
func (p *pipePort) Write(b []byte) (int, error) { return p.w.Write(b) }

// Close releases blocked reads and writes.
func (p *pipePort) Close() error {
	past := time.Unix(1, 0)
	p.r.SetReadDeadline(past)
	p.w.SetWriteDeadline(past)
	return nil
}

// SetReadDeadline sets the read pipe's deadline.
func (p *pipePort) SetReadDeadline(t time.Time) error { return p.r.SetReadDeadline(t) }

// SetWriteDeadline sets the write pipe's deadline.
func (p *pipePort) SetWriteDeadline(t time.Time) error { return p.w.SetWriteDeadline(t) }
