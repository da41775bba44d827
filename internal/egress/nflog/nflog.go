// Package nflog receives the packets that nftables `log group N` rules send to user space over
// NFLOG (nfnetlink_log), so that every blocked egress attempt can be attributed to its destination
// address, port and protocol; it also builds those rules' expressions (LogExprs).
//
// A Reader owns one netlink socket bound to one NFLOG group in one network namespace, and one
// goroutine that reads it. The goroutine ends when the Reader's context ends or Close is called;
// Close waits for it.
package nflog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// DefaultCopyRange is the number of bytes of each packet copied when Listen is given 0: an IPv4
// header with the most options (60 bytes) plus the ports of a TCP or UDP header.
const DefaultCopyRange = 64

// rcvBuf is the socket receive buffer asked for. The kernel sends every logged packet in its own
// buffer of about a page, so this holds some two thousand packets queued before overruns.
const rcvBuf = 8 << 20

// Event is one logged packet.
type Event struct {
	// Prefix is the log rule's prefix, e.g. "corral:12:no_rule".
	Prefix   string
	Src, Dst netip.Addr
	// Proto is "tcp", "udp", "icmp", "icmpv6", or the protocol number in decimal.
	Proto string
	// DstPort is the TCP or UDP destination port; 0 for other protocols, for fragments after the
	// first, and when the copied bytes end before the port.
	DstPort uint16
	// At is the kernel's timestamp of the packet when it has one, otherwise when it was read.
	At time.Time
}

// Stats counts what a Reader saw.
type Stats struct {
	// Received counts packet messages read, ParseErrors those of them that gave no Event.
	Received, ParseErrors uint64
	// Overruns counts the times the socket's receive buffer overflowed (ENOBUFS): the kernel
	// dropped an unknown number of messages because fn or the reader fell behind.
	Overruns uint64
}

// Reader receives one NFLOG group's packets. Its methods are safe for concurrent use.
type Reader struct {
	conn  *netlink.Conn
	rc    syscall.RawConn
	group uint16
	fn    func(Event)
	log   *slog.Logger
	buf   []byte // used by the reading goroutine only (by Listen before it starts)

	closeOnce sync.Once
	closeErr  error         // set inside closeOnce
	quit      chan struct{} // closed by Close, before the socket is
	done      chan struct{} // closed when the reading goroutine returns

	received, parseErrors, overruns atomic.Uint64
}

// Listen binds NFLOG group (1-65535) and calls fn for every packet logged to it until ctx ends or
// Close is called. It returns once the group is bound, so rules logging to the group may be added
// right after. copyRange bytes of each packet are copied (0: DefaultCopyRange); fewer than the
// IP header make every packet a parse error.
//
// The socket is created on the calling OS thread, in that thread's network namespace, and stays
// in it: to listen in another namespace, lock the thread, enter the namespace, call Listen, and
// leave again. Only one socket in a namespace can bind a group; a second Listen fails with an
// errdefs.ErrConflict error. Binding needs CAP_NET_ADMIN (errdefs.ErrDenied without it).
//
// fn is called from one goroutine at a time, in the order packets were logged; a slow fn makes
// the kernel drop messages (counted in Stats.Overruns). fn must not call Close.
func Listen(ctx context.Context, group uint16, copyRange uint16, fn func(Event), log *slog.Logger) (*Reader, error) {
	if group == 0 {
		return nil, errdefs.Invalid("nflog_group", "0: want 1-65535")
	}
	if copyRange == 0 {
		copyRange = DefaultCopyRange
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, fmt.Errorf("nflog: open netlink socket: %w", err)
	}
	rc, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("nflog: netlink socket: %w", err)
	}
	r := &Reader{conn: conn, rc: rc, group: group, fn: fn, log: log, quit: make(chan struct{}),
		done: make(chan struct{}), buf: make([]byte, 1<<17+int(copyRange))}
	r.setRcvBuf()
	// Bind and configure in one message: the kernel applies the mode and threshold to the
	// instance it has just created, before the first packet can be logged with the defaults.
	// No NFULNL_CFG_CMD_PF_UNBIND/PF_BIND first: they are not harmless, they replace the
	// namespace's default logger for the family (the host's, in /proc/net/netfilter/nf_log),
	// and rules with `log group` name their logger anyway.
	err = r.request(group, unix.AF_UNSPEC,
		attr(nfulaCfgCmd, nfulnlCfgCmdBind),
		modeAttr(copyRange),
		// Send each packet at once rather than batching up to a second's worth.
		attr(nfulaCfgQThresh, be32(1)...),
	)
	if err != nil {
		conn.Close()
		// The kernel answers EPERM both to a process without CAP_NET_ADMIN and to a group bound
		// by another socket.
		switch {
		case errors.Is(err, unix.EPERM) && !hasNetAdmin():
			return nil, fmt.Errorf("nflog: bind group %d: needs CAP_NET_ADMIN: %w (%w)", group, errdefs.ErrDenied, err)
		case errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EPERM):
			return nil, errdefs.Conflict("nflog: bind group %d: another socket has bound it (%v)", group, err)
		}
		return nil, fmt.Errorf("nflog: bind group %d: %w", group, err)
	}
	go r.run()
	go func() {
		select {
		case <-ctx.Done():
			r.Close()
		case <-r.quit:
		}
	}()
	return r, nil
}

// hasNetAdmin reports whether the calling thread has CAP_NET_ADMIN, or cannot tell.
func hasNetAdmin() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return true
	}
	return data[0].Effective&(1<<unix.CAP_NET_ADMIN) != 0
}

// setRcvBuf enlarges the receive buffer, past net.core.rmem_max when the process may.
func (r *Reader) setRcvBuf() {
	var serr error
	err := r.rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvBuf)
	})
	if err == nil && serr == nil {
		return
	}
	if err := r.conn.SetReadBuffer(rcvBuf); err != nil {
		r.log.Warn("nflog: set receive buffer", "err", err)
	}
}

// Close unbinds the group, ends the reading goroutine and waits for it. It is idempotent.
func (r *Reader) Close() error {
	r.closeOnce.Do(func() {
		close(r.quit)
		// Closing the socket alone would release the group too; unbinding says so explicitly.
		// No acknowledgement is asked for: nobody reads one any more.
		if m, err := configMsg(r.group, unix.AF_UNSPEC, false, attr(nfulaCfgCmd, nfulnlCfgCmdUnbind)); err == nil {
			r.conn.Send(m)
		}
		r.closeErr = r.conn.Close()
		<-r.done
	})
	return r.closeErr
}

// Stats returns the counters so far.
func (r *Reader) Stats() Stats {
	return Stats{Received: r.received.Load(), ParseErrors: r.parseErrors.Load(), Overruns: r.overruns.Load()}
}

// run reads until the socket is closed.
func (r *Reader) run() {
	defer close(r.done)
	for {
		msgs, err := r.read()
		select {
		case <-r.quit:
			return
		default:
		}
		switch {
		case errors.Is(err, unix.ENOBUFS):
			r.overruns.Add(1)
			continue
		case err != nil:
			// Nothing else is expected from a healthy socket; stop rather than spin.
			r.log.Error("nflog: receive failed, no longer attributing dropped packets", "group", r.group, "err", err)
			return
		}
		for _, m := range msgs {
			r.handle(m)
		}
	}
}

// read waits for one datagram from the kernel and splits it into messages. Datagrams from other
// sockets (user space may unicast to any port id) are dropped.
func (r *Reader) read() ([]syscall.NetlinkMessage, error) {
	var n int
	var from unix.Sockaddr
	var rerr error
	err := r.rc.Read(func(fd uintptr) bool {
		n, from, rerr = unix.Recvfrom(int(fd), r.buf, unix.MSG_TRUNC)
		return rerr != unix.EAGAIN
	})
	if err != nil {
		return nil, err
	}
	if rerr != nil {
		return nil, os.NewSyscallError("recvfrom", rerr)
	}
	if sa, ok := from.(*unix.SockaddrNetlink); !ok || sa.Pid != 0 {
		return nil, nil
	}
	if n > len(r.buf) {
		r.parseErrors.Add(1)
		r.log.Debug("nflog: datagram larger than the buffer", "size", n)
		return nil, nil
	}
	msgs, err := syscall.ParseNetlinkMessage(r.buf[:n])
	if err != nil {
		r.parseErrors.Add(1)
		r.log.Debug("nflog: malformed datagram", "err", err)
		return nil, nil
	}
	return msgs, nil
}

// handle turns a packet message into an Event for fn; it ignores every other message.
func (r *Reader) handle(m syscall.NetlinkMessage) {
	if m.Header.Type != packetMsgType {
		return
	}
	r.received.Add(1)
	ev, err := parseMessage(m.Data)
	if err != nil {
		r.parseErrors.Add(1)
		r.log.Debug("nflog: unparsable packet", "group", r.group, "err", err)
		return
	}
	if ev.At.IsZero() {
		ev.At = time.Now()
	}
	r.fn(ev)
}

// request sends a configuration message and waits for its acknowledgement. Packet messages that
// arrive meanwhile are handled as usual.
func (r *Reader) request(group uint16, family uint8, attrs ...netlink.Attribute) error {
	m, err := configMsg(group, family, true, attrs...)
	if err != nil {
		return err
	}
	sent, err := r.conn.Send(m)
	if err != nil {
		return err
	}
	for {
		msgs, err := r.read()
		if errors.Is(err, unix.ENOBUFS) {
			r.overruns.Add(1)
			continue
		}
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR || m.Header.Seq != sent.Header.Sequence {
				r.handle(m)
				continue
			}
			if len(m.Data) < 4 {
				return errors.New("short netlink acknowledgement")
			}
			if code := int32(nativeEndian.Uint32(m.Data)); code != 0 {
				return unix.Errno(-code)
			}
			return nil
		}
	}
}
