// Package vmlink carries the edge's connections to a microVM's agent over the VM's one
// virtio-serial port (see docs/microvm-notes.md §3): many concurrent streams, multiplexed with
// yamux over a single byte stream that QEMU exposes on the host as a unix socket (its chardev)
// and the guest reads and writes as /dev/vportNpM.
//
// That byte stream is not a connection: QEMU accepts one host client at a time, the guest cannot
// tell one host client from the next, bytes written for an old session may reach the next one
// (in both directions), the guest's writes block while no host client is connected, and the host
// side comes and goes (the edge restarts; a paused VM resumes in a new QEMU process while the
// guest keeps running). So every session starts with a handshake that resynchronizes the stream:
//
//	host:  "CORRAL-SYNC <nonce>\n"   (32 lowercase hex digits, fresh for every attempt)
//	guest: discards input until it reads such a line, answers "CORRAL-ACK <nonce>\n"
//	host:  discards input until it reads the ACK of its own nonce (at most 1 MiB, and a timeout)
//
// and then both sides run yamux on the stream, the host as the client (it opens every stream) and
// the guest as the server. A session ends when either side sees the stream fail (EOF, a protocol
// error, a missed keepalive); both sides then start over with a new handshake. Streams of a
// broken session fail; nothing is replayed: the agent keeps commands by id, so clients re-attach.
//
// Host side: Connect returns one Session; Proxy serves a unix socket for internal/agentrpc's
// Client and forwards each accepted connection over a stream of the current session, connecting
// again on demand. Guest side: Listen returns a net.Listener whose Accept yields the streams of
// whatever session is current.
package vmlink

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/hashicorp/yamux"
)

// Handshake lines: a prefix, a nonce of nonceLen lowercase hex digits, a newline.
const (
	syncPrefix = "CORRAL-SYNC "
	ackPrefix  = "CORRAL-ACK "
	nonceLen   = 32
)

// maxJunk bounds what the host discards while it waits for the guest's ACK: the tail of an old
// session (a yamux window is 256 KiB per stream) but not an endless stream.
const maxJunk = 1 << 20

// errTooMuchJunk is returned by the host's handshake after maxJunk bytes without the ACK.
var errTooMuchJunk = errors.New("no handshake answer in the first 1 MiB")

// newNonce returns a fresh random nonce.
func newNonce() string {
	var b [nonceLen / 2]byte
	rand.Read(b[:]) // never fails (crypto/rand panics rather than return an error)
	return hex.EncodeToString(b[:])
}

// awaitLine reads r until it has read line (which ends in '\n'), discarding everything before it,
// and fails after limit bytes without it.
func awaitLine(r io.ByteReader, line []byte, limit int) error {
	win := make([]byte, 0, 2*len(line))
	for n := 0; ; n++ {
		if n >= limit {
			return errTooMuchJunk
		}
		b, err := r.ReadByte()
		if err != nil {
			return err
		}
		if len(win) == cap(win) {
			win = append(win[:0], win[len(win)-len(line)+1:]...)
		}
		win = append(win, b)
		if b == '\n' && bytes.HasSuffix(win, line) {
			return nil
		}
	}
}

// readSync reads r until it has read a SYNC line and returns its nonce. Everything else is
// discarded, without limit: the guest waits for a host as long as it takes.
func readSync(r io.ByteReader) (string, error) {
	prefix := []byte(syncPrefix)
	win := make([]byte, 0, 2*len(prefix))
	var nonce []byte
	inNonce := false
	for {
		b, err := r.ReadByte()
		if err != nil {
			return "", err
		}
		if inNonce {
			switch {
			case b == '\n' && len(nonce) == nonceLen:
				return string(nonce), nil
			case isLowerHex(b) && len(nonce) < nonceLen:
				nonce = append(nonce, b)
				continue
			}
			// Not a SYNC line after all: scan on from this byte.
			inNonce = false
		}
		if len(win) == cap(win) {
			win = append(win[:0], win[len(win)-len(prefix)+1:]...)
		}
		win = append(win, b)
		if b == ' ' && bytes.HasSuffix(win, prefix) {
			inNonce, nonce, win = true, nonce[:0], win[:0]
		}
	}
}

func isLowerHex(b byte) bool { return b >= '0' && b <= '9' || b >= 'a' && b <= 'f' }

// Yamux settings, the same on both sides.
const (
	// keepAliveInterval and writeTimeout bound how long a dead peer goes unnoticed: a ping every
	// keepAliveInterval, answered within writeTimeout (which also bounds one write to the
	// stream). Generous, because a TCG guest on a loaded host is slow.
	keepAliveInterval = 10 * time.Second
	writeTimeout      = 15 * time.Second
	// streamOpenTimeout ends a session whose peer does not acknowledge a new stream in time.
	streamOpenTimeout = 30 * time.Second
	// hostStreamCloseTimeout: a stream the host closed (its client went away) is reset this long
	// after, unless the guest closed its end meanwhile. The reset is what fails an agent's write
	// that waits for window space nobody will ever grant; yamux has no other way to abort one.
	hostStreamCloseTimeout  = 5 * time.Second
	guestStreamCloseTimeout = 30 * time.Second
)

// muxConfig returns the yamux configuration of one side. Window sizes stay at the default
// (256 KiB per stream).
func muxConfig(log *slog.Logger, host bool) *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = true
	c.KeepAliveInterval = keepAliveInterval
	c.ConnectionWriteTimeout = writeTimeout
	c.StreamOpenTimeout = streamOpenTimeout
	c.StreamCloseTimeout = guestStreamCloseTimeout
	if host {
		c.StreamCloseTimeout = hostStreamCloseTimeout
	}
	c.LogOutput = nil
	c.Logger = muxLogger{log}
	return c
}

// muxLogger passes yamux's log lines to a slog.Logger at debug level.
type muxLogger struct{ log *slog.Logger }

// Print logs v.
func (l muxLogger) Print(v ...any) { l.log.Debug("yamux: " + fmt.Sprint(v...)) }

// Printf logs a formatted line.
func (l muxLogger) Printf(format string, v ...any) {
	l.log.Debug("yamux: " + fmt.Sprintf(format, v...))
}

// Println logs v.
func (l muxLogger) Println(v ...any) { l.log.Debug("yamux: " + fmt.Sprint(v...)) }

// orDiscard returns log, or a logger that discards everything when log is nil.
func orDiscard(log *slog.Logger) *slog.Logger {
	if log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return log
}

// byteReader reads pending before r.
type byteReader struct {
	pending []byte
	r       *bufio.Reader
}

// ReadByte returns the next pending byte, then r's.
func (b *byteReader) ReadByte() (byte, error) {
	if len(b.pending) > 0 {
		c := b.pending[0]
		b.pending = b.pending[1:]
		return c, nil
	}
	return b.r.ReadByte()
}
