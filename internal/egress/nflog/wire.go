package nflog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// From include/uapi/linux/netfilter/nfnetlink_log.h; golang.org/x/sys/unix has only
// NFNL_SUBSYS_ULOG and NFNETLINK_V0 of these.
const (
	nfulnlMsgPacket = 0 // enum nfulnl_msg_types
	nfulnlMsgConfig = 1

	nfulaTimestamp = 3 // enum nfulnl_attr_type
	nfulaPayload   = 9
	nfulaPrefix    = 10

	nfulaCfgCmd     = 1 // enum nfulnl_attr_config
	nfulaCfgMode    = 2
	nfulaCfgQThresh = 5

	nfulnlCfgCmdBind   = 1 // enum nfulnl_msg_config_cmds
	nfulnlCfgCmdUnbind = 2

	nfulnlCopyPacket = 2

	nlaTypeMask = ^uint16(unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
)

const (
	packetMsgType = unix.NFNL_SUBSYS_ULOG<<8 | nfulnlMsgPacket
	configMsgType = unix.NFNL_SUBSYS_ULOG<<8 | nfulnlMsgConfig
)

// Netlink headers and attribute headers are in host order, the contents of nfnetlink's
// structures in network order.
var nativeEndian = binary.NativeEndian

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func attr(typ uint16, data ...byte) netlink.Attribute {
	return netlink.Attribute{Type: typ, Data: data}
}

// modeAttr is NFULA_CFG_MODE: struct nfulnl_msg_config_mode {be32 copy_range; u8 copy_mode; u8 pad}.
func modeAttr(copyRange uint16) netlink.Attribute {
	return attr(nfulaCfgMode, append(be32(uint32(copyRange)), nfulnlCopyPacket, 0)...)
}

// configMsg builds an NFULNL_MSG_CONFIG request for group: struct nfgenmsg {u8 family; u8
// version; be16 res_id} followed by the attributes.
func configMsg(group uint16, family uint8, ack bool, attrs ...netlink.Attribute) (netlink.Message, error) {
	ab, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return netlink.Message{}, err
	}
	flags := netlink.Request
	if ack {
		flags |= netlink.Acknowledge
	}
	data := append([]byte{family, unix.NFNETLINK_V0}, binary.BigEndian.AppendUint16(nil, group)...)
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(configMsgType), Flags: flags},
		Data:   append(data, ab...),
	}, nil
}

var errTruncated = errors.New("truncated")

// walkAttrs calls fn with the type (without the NLA_F_NESTED and NLA_F_NET_BYTEORDER flags) and
// the payload of each netlink attribute in b.
func walkAttrs(b []byte, fn func(typ uint16, data []byte)) error {
	for len(b) > 0 {
		if len(b) < 4 {
			return fmt.Errorf("attribute header: %w", errTruncated)
		}
		n := int(nativeEndian.Uint16(b))
		if n < 4 || n > len(b) {
			return fmt.Errorf("attribute length %d of %d bytes left: %w", n, len(b), errTruncated)
		}
		fn(nativeEndian.Uint16(b[2:])&nlaTypeMask, b[4:n])
		b = b[min((n+unix.NLA_ALIGNTO-1)&^(unix.NLA_ALIGNTO-1), len(b)):]
	}
	return nil
}

// parseMessage parses the body of an NFULNL_MSG_PACKET message (after the netlink header).
func parseMessage(b []byte) (Event, error) {
	if len(b) < 4 {
		return Event{}, fmt.Errorf("nfgenmsg: %w", errTruncated)
	}
	var ev Event
	var payload []byte
	havePayload := false
	err := walkAttrs(b[4:], func(typ uint16, data []byte) {
		switch typ {
		case nfulaPrefix:
			ev.Prefix, _, _ = strings.Cut(string(data), "\x00")
		case nfulaPayload:
			payload, havePayload = data, true
		case nfulaTimestamp:
			// struct nfulnl_msg_packet_timestamp {be64 sec; be64 usec}
			if len(data) >= 16 {
				sec := int64(binary.BigEndian.Uint64(data))
				usec := int64(binary.BigEndian.Uint64(data[8:]))
				ev.At = time.Unix(sec, usec*1000)
			}
		}
	})
	if err != nil {
		return Event{}, err
	}
	if !havePayload {
		return Event{}, errors.New("no payload: the group was bound without copying packets")
	}
	p, err := parsePacket(payload)
	if err != nil {
		return Event{}, err
	}
	ev.Src, ev.Dst, ev.DstPort = p.src, p.dst, p.dport
	ev.Proto = protoName(p.proto)
	return ev, nil
}

// packet is what parsePacket reads from an IP packet.
type packet struct {
	src, dst netip.Addr
	proto    uint8
	dport    uint16
}

// parsePacket reads the addresses, the transport protocol and the TCP or UDP destination port of
// an IPv4 or IPv6 packet, which may be cut anywhere after its IP header (IPv6: fixed header).
func parsePacket(b []byte) (packet, error) {
	if len(b) < 1 {
		return packet{}, fmt.Errorf("ip header: %w", errTruncated)
	}
	switch b[0] >> 4 {
	case 4:
		return parseIPv4(b)
	case 6:
		return parseIPv6(b)
	default:
		return packet{}, fmt.Errorf("ip version %d: not 4 or 6", b[0]>>4)
	}
}

func parseIPv4(b []byte) (packet, error) {
	if len(b) < 20 {
		return packet{}, fmt.Errorf("ipv4 header: %w", errTruncated)
	}
	hl := int(b[0]&0x0f) * 4
	if hl < 20 {
		return packet{}, fmt.Errorf("ipv4 header length %d", hl)
	}
	p := packet{
		src:   netip.AddrFrom4([4]byte(b[12:16])),
		dst:   netip.AddrFrom4([4]byte(b[16:20])),
		proto: b[9],
	}
	// Only the first fragment carries the transport header.
	if binary.BigEndian.Uint16(b[6:])&0x1fff != 0 || len(b) < hl {
		return p, nil
	}
	p.dport = dport(p.proto, b[hl:])
	return p, nil
}

func parseIPv6(b []byte) (packet, error) {
	if len(b) < 40 {
		return packet{}, fmt.Errorf("ipv6 header: %w", errTruncated)
	}
	p := packet{
		src:   netip.AddrFrom16([16]byte(b[8:24])),
		dst:   netip.AddrFrom16([16]byte(b[24:40])),
		proto: b[6],
	}
	// Skip the extension headers that come before a transport header; each is at least 8 bytes,
	// so this ends. Where the copy ends inside them, the last next-header read is reported.
	rest := b[40:]
	for len(rest) >= 8 {
		var n int
		switch p.proto {
		case unix.IPPROTO_HOPOPTS, unix.IPPROTO_ROUTING, unix.IPPROTO_DSTOPTS:
			n = (int(rest[1]) + 1) * 8
		case unix.IPPROTO_AH:
			n = (int(rest[1]) + 2) * 4
		case unix.IPPROTO_FRAGMENT:
			if binary.BigEndian.Uint16(rest[2:])>>3 != 0 {
				p.proto = rest[0]
				return p, nil // not the first fragment: no transport header
			}
			n = 8
		default:
			p.dport = dport(p.proto, rest)
			return p, nil
		}
		p.proto = rest[0]
		if n > len(rest) {
			return p, nil
		}
		rest = rest[n:]
	}
	p.dport = dport(p.proto, rest)
	return p, nil
}

// dport reads the destination port of a TCP or UDP header, 0 for other protocols or when it was
// not copied.
func dport(proto uint8, l4 []byte) uint16 {
	if (proto != unix.IPPROTO_TCP && proto != unix.IPPROTO_UDP) || len(l4) < 4 {
		return 0
	}
	return binary.BigEndian.Uint16(l4[2:])
}

func protoName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_ICMP:
		return "icmp"
	case unix.IPPROTO_ICMPV6:
		return "icmpv6"
	}
	return strconv.Itoa(int(p))
}
