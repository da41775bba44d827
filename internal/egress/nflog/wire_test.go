package nflog

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// ipv4 builds an IPv4 packet with opts (a multiple of 4 bytes) and l4 after the header.
func ipv4(proto uint8, src, dst string, fragOff uint16, opts, l4 []byte) []byte {
	hl := 20 + len(opts)
	b := make([]byte, hl, hl+len(l4))
	b[0] = 0x40 | byte(hl/4)
	binary.BigEndian.PutUint16(b[2:], uint16(hl+len(l4)))
	binary.BigEndian.PutUint16(b[6:], fragOff)
	b[8] = 64
	b[9] = proto
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	copy(b[20:], opts)
	return append(b, l4...)
}

// ipv6 builds an IPv6 packet whose first next header is next, followed by rest.
func ipv6(next uint8, src, dst string, rest []byte) []byte {
	b := make([]byte, 40, 40+len(rest))
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:], uint16(len(rest)))
	b[6] = next
	b[7] = 64
	s, d := netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
	copy(b[8:], s[:])
	copy(b[24:], d[:])
	return append(b, rest...)
}

// ports is the start of a TCP or UDP header.
func ports(src, dst uint16) []byte {
	return binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, src), dst)
}

func TestParsePacket(t *testing.T) {
	const a, b = "10.200.0.2", "93.184.216.34"
	tcp := append(ports(40000, 443), make([]byte, 16)...)
	icmpEcho := []byte{8, 0, 0, 0, 0, 1, 0, 1}
	tests := []struct {
		name    string
		in      []byte
		want    packet
		wantErr bool
	}{
		{"tcp", ipv4(unix.IPPROTO_TCP, a, b, 0, nil, tcp), want4(a, b, unix.IPPROTO_TCP, 443), false},
		{"udp", ipv4(unix.IPPROTO_UDP, a, b, 0, nil, append(ports(5353, 53), 0, 8, 0, 0)), want4(a, b, unix.IPPROTO_UDP, 53), false},
		{"icmp", ipv4(unix.IPPROTO_ICMP, a, b, 0, nil, icmpEcho), want4(a, b, unix.IPPROTO_ICMP, 0), false},
		{"other protocol", ipv4(unix.IPPROTO_GRE, a, b, 0, nil, ports(1, 2)), want4(a, b, unix.IPPROTO_GRE, 0), false},
		{"ip options", ipv4(unix.IPPROTO_TCP, a, b, 0, []byte{1, 1, 1, 0}, tcp), want4(a, b, unix.IPPROTO_TCP, 443), false},
		{"40 bytes of options", ipv4(unix.IPPROTO_UDP, a, b, 0, bytes.Repeat([]byte{1}, 40), ports(1, 8080)), want4(a, b, unix.IPPROTO_UDP, 8080), false},
		{"first fragment", ipv4(unix.IPPROTO_UDP, a, b, 0x2000, nil, ports(1, 53)), want4(a, b, unix.IPPROTO_UDP, 53), false},
		{"later fragment", ipv4(unix.IPPROTO_UDP, a, b, 0x0010, nil, ports(1, 53)), want4(a, b, unix.IPPROTO_UDP, 0), false},
		{"cut in the ports", ipv4(unix.IPPROTO_TCP, a, b, 0, nil, []byte{0x9c, 0x40, 0x01}), want4(a, b, unix.IPPROTO_TCP, 0), false},
		{"cut in the options", ipv4(unix.IPPROTO_TCP, a, b, 0, []byte{1, 1, 1, 0}, tcp)[:22], want4(a, b, unix.IPPROTO_TCP, 0), false},
		{"no l4 header", ipv4(unix.IPPROTO_TCP, a, b, 0, nil, nil), want4(a, b, unix.IPPROTO_TCP, 0), false},
		{"empty", nil, packet{}, true},
		{"short ipv4", ipv4(unix.IPPROTO_TCP, a, b, 0, nil, nil)[:19], packet{}, true},
		{"ihl below 5", func() []byte { p := ipv4(unix.IPPROTO_TCP, a, b, 0, nil, tcp); p[0] = 0x44; return p }(), packet{}, true},
		{"version 5", func() []byte { p := ipv4(unix.IPPROTO_TCP, a, b, 0, nil, tcp); p[0] = 0x55; return p }(), packet{}, true},
		{"garbage", []byte("GET / HTTP/1.1\r\n"), packet{}, true},
		{"ipv6 tcp", ipv6(unix.IPPROTO_TCP, "fd00::2", "2001:db8::1", tcp), want6("fd00::2", "2001:db8::1", unix.IPPROTO_TCP, 443), false},
		{"ipv6 hop-by-hop then udp", ipv6(unix.IPPROTO_HOPOPTS, "fd00::2", "2001:db8::1",
			append([]byte{unix.IPPROTO_UDP, 0, 1, 4, 0, 0, 0, 0}, ports(1, 53)...)), want6("fd00::2", "2001:db8::1", unix.IPPROTO_UDP, 53), false},
		{"ipv6 later fragment", ipv6(unix.IPPROTO_FRAGMENT, "fd00::2", "2001:db8::1",
			append([]byte{unix.IPPROTO_UDP, 0, 0, 0x10, 0, 0, 0, 1}, ports(1, 53)...)), want6("fd00::2", "2001:db8::1", unix.IPPROTO_UDP, 0), false},
		{"ipv6 cut in an extension", ipv6(unix.IPPROTO_HOPOPTS, "fd00::2", "2001:db8::1",
			[]byte{unix.IPPROTO_TCP, 1, 1, 4, 0, 0, 0, 0}), want6("fd00::2", "2001:db8::1", unix.IPPROTO_TCP, 0), false},
		{"short ipv6", ipv6(unix.IPPROTO_TCP, "fd00::2", "2001:db8::1", nil)[:39], packet{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parsePacket(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parsePacket: err = %v, want error %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("parsePacket = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func want4(src, dst string, proto uint8, port uint16) packet {
	return packet{netip.MustParseAddr(src), netip.MustParseAddr(dst), proto, port}
}

func want6(src, dst string, proto uint8, port uint16) packet {
	return want4(src, dst, proto, port)
}

// rawAttr encodes one netlink attribute by hand, padding included.
func rawAttr(typ uint16, data []byte) []byte {
	b := nativeEndian.AppendUint16(nil, uint16(4+len(data)))
	b = nativeEndian.AppendUint16(b, typ)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func TestWalkAttrs(t *testing.T) {
	type seen struct {
		typ  uint16
		data string
	}
	tests := []struct {
		name    string
		in      []byte
		want    []seen
		wantErr bool
	}{
		{"none", nil, nil, false},
		{"padded", slices.Concat(rawAttr(10, []byte("ab\x00")), rawAttr(9, []byte{1, 2, 3, 4, 5})),
			[]seen{{10, "ab\x00"}, {9, "\x01\x02\x03\x04\x05"}}, false},
		{"flags stripped", rawAttr(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER|3, []byte{7, 7, 7, 7}),
			[]seen{{3, "\x07\x07\x07\x07"}}, false},
		{"empty payload", rawAttr(1, nil), []seen{{1, ""}}, false},
		{"last unpadded", rawAttr(10, []byte("x"))[:5], []seen{{10, "x"}}, false},
		{"trailing bytes", append(rawAttr(1, nil), 0, 0), []seen{{1, ""}}, true},
		{"length below header", []byte{2, 0, 1, 0}, nil, true},
		{"length past the end", append(rawAttr(1, []byte{1, 2, 3, 4}), 0xff, 0, 1, 0), []seen{{1, "\x01\x02\x03\x04"}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []seen
			err := walkAttrs(tt.in, func(typ uint16, data []byte) { got = append(got, seen{typ, string(data)}) })
			if (err != nil) != tt.wantErr {
				t.Fatalf("walkAttrs: err = %v, want error %v", err, tt.wantErr)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("walkAttrs saw %+v, want %+v", got, tt.want)
			}
		})
	}
}

// packetMsg builds the body of an NFULNL_MSG_PACKET message.
func packetMsg(attrs ...[]byte) []byte {
	return slices.Concat(append([][]byte{{unix.AF_INET, unix.NFNETLINK_V0, 0, 7}}, attrs...)...)
}

func TestParseMessage(t *testing.T) {
	pkt := ipv4(unix.IPPROTO_UDP, "10.200.0.2", "1.1.1.1", 0, nil, ports(4000, 4444))
	ts := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, 1700000000), 250000)
	hdr := rawAttr(1, []byte{0x08, 0x00, 3, 0}) // NFULA_PACKET_HDR, ignored

	got, err := parseMessage(packetMsg(hdr, rawAttr(nfulaPrefix, []byte("corral:3:denied\x00")),
		rawAttr(nfulaTimestamp, ts), rawAttr(nfulaPayload, pkt)))
	if err != nil {
		t.Fatalf("parseMessage: %v", err)
	}
	want := Event{Prefix: "corral:3:denied", Src: netip.MustParseAddr("10.200.0.2"), Dst: netip.MustParseAddr("1.1.1.1"),
		Proto: "udp", DstPort: 4444, At: time.Unix(1700000000, 250000000)}
	if got != want {
		t.Errorf("parseMessage = %+v, want %+v", got, want)
	}

	got, err = parseMessage(packetMsg(rawAttr(nfulaPayload, ipv4(unix.IPPROTO_ICMP, "10.0.0.1", "10.0.0.2", 0, nil, nil))))
	if err != nil {
		t.Fatalf("parseMessage without prefix or timestamp: %v", err)
	}
	if got.Prefix != "" || got.Proto != "icmp" || !got.At.IsZero() {
		t.Errorf("parseMessage without prefix or timestamp = %+v, want no prefix, icmp, no time", got)
	}

	for name, in := range map[string][]byte{
		"no payload":   packetMsg(rawAttr(nfulaPrefix, []byte("p\x00"))),
		"no nfgenmsg":  {unix.AF_INET, 0},
		"bad attrs":    packetMsg([]byte{0xff, 0, 9, 0}),
		"bad payload":  packetMsg(rawAttr(nfulaPayload, []byte{0x45, 0})),
		"empty packet": packetMsg(rawAttr(nfulaPayload, nil)),
	} {
		if _, err := parseMessage(in); err == nil {
			t.Errorf("parseMessage(%s): no error", name)
		}
	}
}

func TestProtoName(t *testing.T) {
	for p, want := range map[uint8]string{6: "tcp", 17: "udp", 1: "icmp", 58: "icmpv6", 47: "47", 0: "0"} {
		if got := protoName(p); got != want {
			t.Errorf("protoName(%d) = %q, want %q", p, got, want)
		}
	}
}

func TestConfigMsg(t *testing.T) {
	m, err := configMsg(7, unix.AF_UNSPEC, true, attr(nfulaCfgCmd, nfulnlCfgCmdBind), modeAttr(64))
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Type != netlink.HeaderType(0x0401) || m.Header.Flags != netlink.Request|netlink.Acknowledge {
		t.Errorf("header = %+v, want type 0x0401, flags request|ack", m.Header)
	}
	want := slices.Concat([]byte{unix.AF_UNSPEC, 0, 0, 7},
		rawAttr(1, []byte{1}),                 // NFULA_CFG_CMD {BIND}
		rawAttr(2, []byte{0, 0, 0, 64, 2, 0})) // NFULA_CFG_MODE {be32 64, COPY_PACKET, pad}
	if !bytes.Equal(m.Data, want) {
		t.Errorf("data = % x, want % x", m.Data, want)
	}
}

func TestLogExprs(t *testing.T) {
	got := LogExprs(9, "corral:1:no_rule")
	if len(got) != 2 {
		t.Fatalf("LogExprs returned %d expressions, want limit and log", len(got))
	}
	lim, ok := got[0].(*expr.Limit)
	if !ok || lim.Over || lim.Rate != LogRate || lim.Burst != LogBurst || lim.Unit != expr.LimitTimeSecond || lim.Type != expr.LimitTypePkts {
		t.Errorf("first expression = %#v, want limit rate %d/second burst %d packets", got[0], LogRate, LogBurst)
	}
	log, ok := got[1].(*expr.Log)
	if !ok || log.Group != 9 || string(log.Data) != "corral:1:no_rule" || log.Key != 1<<unix.NFTA_LOG_GROUP|1<<unix.NFTA_LOG_PREFIX {
		t.Errorf("second expression = %#v, want log group 9 prefix corral:1:no_rule", got[1])
	}
	for _, e := range got {
		if _, ok := e.(*expr.Verdict); ok {
			t.Errorf("LogExprs has a verdict: the drop belongs to the caller's next rule")
		}
	}
	long := LogExprs(1, string(bytes.Repeat([]byte("x"), 300)))[1].(*expr.Log)
	if len(long.Data) != maxPrefix {
		t.Errorf("prefix of 300 bytes kept %d, want %d", len(long.Data), maxPrefix)
	}
}

func TestListenGroupZero(t *testing.T) {
	_, err := Listen(context.Background(), 0, 0, func(Event) {}, nil)
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Listen(group 0) = %v, want ErrInvalid", err)
	}
}

func FuzzParsePacket(f *testing.F) {
	f.Add(ipv4(unix.IPPROTO_TCP, "10.0.0.1", "10.0.0.2", 0, nil, ports(1, 443)))
	f.Add(ipv4(unix.IPPROTO_UDP, "10.0.0.1", "10.0.0.2", 0, []byte{1, 1, 1, 0}, ports(1, 53)))
	f.Add(ipv6(unix.IPPROTO_HOPOPTS, "fd00::1", "fd00::2", append([]byte{unix.IPPROTO_UDP, 0, 1, 4, 0, 0, 0, 0}, ports(1, 53)...)))
	f.Add([]byte{0x4f})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parsePacket(b)
		if err != nil {
			return
		}
		if !p.src.IsValid() || !p.dst.IsValid() {
			t.Fatalf("parsePacket(% x) = %+v without error, want valid addresses", b, p)
		}
		if p.dport != 0 && p.proto != unix.IPPROTO_TCP && p.proto != unix.IPPROTO_UDP {
			t.Fatalf("parsePacket(% x) = %+v, a port for protocol %d", b, p, p.proto)
		}
		// The same bytes as a message payload must parse the same way.
		ev, err := parseMessage(packetMsg(rawAttr(nfulaPayload, b)))
		if err != nil || ev.Dst != p.dst || ev.DstPort != p.dport {
			t.Fatalf("parseMessage of a good payload = %+v, %v; want dst %v port %d", ev, err, p.dst, p.dport)
		}
	})
}
