package vmguest

import (
	"bufio"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// receiveConfig is a template VM's wait for its sandbox's Config: it writes ConfigReady on the
// port and reads lines until a config line comes, answering it with ConfigOKPrefix and the
// line's nonce. The host snapshots the VM while it waits here; a VM restored from the snapshot
// finds its host connection gone (or not: the restored port may still count as connected) and
// so either reads the new host's line in the same read or starts over, writing ConfigReady to
// the new host. The port is closed on return, for vmlink.Listen to open again.
func receiveConfig(open func() (io.ReadWriteCloser, error)) (*Config, error) {
	for {
		port, err := open()
		if err != nil {
			return nil, fmt.Errorf("template: open the port: %w", err)
		}
		c, err := exchangeConfig(port)
		port.Close()
		if err == nil {
			return c, nil
		}
		var bad *badConfig
		if errors.As(err, &bad) {
			return nil, err
		}
		// The host went away (EOF while none is connected): wait for the next one.
		time.Sleep(pollInterval)
	}
}

// badConfig is a config line that does not decode: fatal, unlike a lost connection.
type badConfig struct{ err error }

// Error says what was wrong with the line.
func (e *badConfig) Error() string { return "template: the host's config: " + e.err.Error() }

func exchangeConfig(port io.ReadWriter) (*Config, error) {
	if _, err := io.WriteString(port, ConfigReady+"\n"); err != nil {
		return nil, err
	}
	r := bufio.NewReaderSize(port, 64<<10)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		rest, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), ConfigPrefix)
		if !ok {
			continue // what an earlier host or session left behind
		}
		nonce, payload, ok := strings.Cut(rest, " ")
		if !ok {
			return nil, &badConfig{errors.New("no nonce")}
		}
		b, err := base64.StdEncoding.DecodeString(payload)
		if err != nil || len(b) > maxConfig {
			return nil, &badConfig{fmt.Errorf("not base64 of at most %d bytes", maxConfig)}
		}
		c, err := parseConfig(b)
		if err != nil {
			return nil, &badConfig{err}
		}
		if c.Template {
			return nil, &badConfig{errors.New("a template config for a template")}
		}
		if _, err := io.WriteString(port, ConfigOKPrefix+nonce+"\n"); err != nil {
			return nil, err
		}
		return c, nil
	}
}

// applyHostState sets the clock to the host's and adds the host's seed to the entropy pool
// (needs CAP_SYS_TIME and CAP_SYS_ADMIN: before the capabilities are dropped).
func applyHostState(c *Config) error {
	if c.Now > 0 {
		ts := unix.NsecToTimespec(c.Now)
		if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
			return fmt.Errorf("set the clock: %w", err)
		}
	}
	if len(c.Seed) > 0 {
		if err := addEntropy(c.Seed); err != nil {
			return fmt.Errorf("seed the entropy pool: %w", err)
		}
	}
	return nil
}

// addEntropy adds seed to the kernel's pool and credits it (RNDADDENTROPY).
func addEntropy(seed []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	buf := make([]byte, 8+len(seed))
	*(*int32)(unsafe.Pointer(&buf[0])) = int32(len(seed) * 8)
	*(*int32)(unsafe.Pointer(&buf[4])) = int32(len(seed))
	copy(buf[8:], seed)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&buf[0])))
	if errno != 0 {
		return errno
	}
	return nil
}
