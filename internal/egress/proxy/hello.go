package proxy

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
)

// The parsers' verdicts. Every error but errIncomplete is final: more bytes would not help.
var (
	// errIncomplete: the bytes so far are the valid start of a ClientHello or request header.
	errIncomplete = errors.New("incomplete")
	// errMalformed: not a TLS ClientHello or HTTP/1.x request header, or one that servers could
	// read differently from the proxy (a repeated server_name or Host, folded header lines).
	errMalformed = errors.New("not a well-formed ClientHello or HTTP/1.x request header")
	// errNoName: a well-formed ClientHello without server_name, or a request without Host.
	errNoName = errors.New("no server name")
	// errIPLiteral: the name is an IP address.
	errIPLiteral = errors.New("IP address instead of a name")
	// errBadName: the name is no host name (see normalizeName).
	errBadName = errors.New("not a host name")
	// errHostMismatch: an absolute-form or authority-form request target names another host than
	// the Host header.
	errHostMismatch = errors.New("request target and Host header name different hosts")
)

// TLS constants (RFC 8446, RFC 6066).
const (
	recordHeaderLen          = 5
	recordTypeHandshake      = 22
	maxPlaintextLen          = 1 << 14
	handshakeHeaderLen       = 4
	handshakeTypeClientHello = 1
	extServerName            = 0
	nameTypeHostName         = 0
)

// parseClientHello returns the normalized host_name of the server_name extension of the TLS
// ClientHello at the start of data, which may span several handshake records. With errIncomplete,
// need is a lower bound of the bytes it takes to get further, so that a client sending a byte at
// a time is not parsed again for every byte. It never reads outside data and never modifies it.
func parseClientHello(data []byte) (name string, need int, err error) {
	// msg collects the handshake bytes. It aliases data while one record is enough; a second
	// record makes append copy, since the first fragment's capacity ends with it.
	var msg []byte
	for off := 0; ; {
		rec := data[off:]
		if len(rec) >= 1 && rec[0] != recordTypeHandshake {
			return "", 0, errMalformed
		}
		if len(rec) >= 3 && (rec[1] != 3 || rec[2] > 4) {
			return "", 0, errMalformed
		}
		if len(rec) < recordHeaderLen {
			return "", off + recordHeaderLen, errIncomplete
		}
		n := int(binary.BigEndian.Uint16(rec[3:5]))
		if n == 0 || n > maxPlaintextLen {
			return "", 0, errMalformed
		}
		if len(msg) == 0 && len(rec) > recordHeaderLen && rec[recordHeaderLen] != handshakeTypeClientHello {
			return "", 0, errMalformed
		}
		if len(rec) < recordHeaderLen+n {
			return "", off + recordHeaderLen + n, errIncomplete
		}
		msg = append(msg, rec[recordHeaderLen:recordHeaderLen+n:recordHeaderLen+n]...)
		off += recordHeaderLen + n
		if len(msg) < handshakeHeaderLen {
			continue
		}
		if msg[0] != handshakeTypeClientHello {
			return "", 0, errMalformed
		}
		size := int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3])
		if rest := handshakeHeaderLen + size - len(msg); rest > 0 {
			if len(data) == off {
				return "", off + recordHeaderLen + rest, errIncomplete
			}
			continue
		}
		name, err := parseClientHelloBody(msg[handshakeHeaderLen : handshakeHeaderLen+size])
		return name, 0, err
	}
}

// parseClientHelloBody parses a ClientHello message body (RFC 8446 section 4.1.2; TLS 1.0 to 1.2
// share its layout) for its server name.
func parseClientHelloBody(b []byte) (string, error) {
	r := reader(b)
	version, ok := r.uint16()
	if !ok || version>>8 != 3 || !r.skip(32) { // legacy_version, random
		return "", errMalformed
	}
	sessionID, ok := r.vec8()
	if !ok || len(sessionID) > 32 {
		return "", errMalformed
	}
	suites, ok := r.vec16()
	if !ok || len(suites) == 0 || len(suites)%2 != 0 {
		return "", errMalformed
	}
	compression, ok := r.vec8()
	if !ok || len(compression) == 0 {
		return "", errMalformed
	}
	if len(r) == 0 { // no extensions at all (allowed before TLS 1.3)
		return "", errNoName
	}
	exts, ok := r.vec16()
	if !ok || len(r) != 0 {
		return "", errMalformed
	}
	var host []byte
	seen := false
	for len(exts) > 0 {
		typ, ok1 := exts.uint16()
		data, ok2 := exts.vec16()
		if !ok1 || !ok2 {
			return "", errMalformed
		}
		if typ != extServerName {
			continue
		}
		// A second server_name, or a second host_name in it, could be the one a server reads.
		if seen {
			return "", errMalformed
		}
		seen = true
		list, ok := data.vec16()
		if !ok || len(data) != 0 || len(list) == 0 {
			return "", errMalformed
		}
		for len(list) > 0 {
			nameType, ok1 := list.uint8()
			name, ok2 := list.vec16()
			if !ok1 || !ok2 || len(name) == 0 {
				return "", errMalformed
			}
			if nameType != nameTypeHostName {
				continue
			}
			if host != nil {
				return "", errMalformed
			}
			host = name
		}
	}
	if host == nil {
		return "", errNoName
	}
	return normalizeName(string(host))
}

// reader reads big-endian TLS vectors. Each method consumes nothing and returns false when too
// few bytes are left.
type reader []byte

func (r *reader) uint8() (uint8, bool) {
	if len(*r) < 1 {
		return 0, false
	}
	v := (*r)[0]
	*r = (*r)[1:]
	return v, true
}

func (r *reader) uint16() (uint16, bool) {
	if len(*r) < 2 {
		return 0, false
	}
	v := binary.BigEndian.Uint16(*r)
	*r = (*r)[2:]
	return v, true
}

func (r *reader) skip(n int) bool {
	if len(*r) < n {
		return false
	}
	*r = (*r)[n:]
	return true
}

// vec8 and vec16 read a vector with a 1- or 2-byte length prefix.
func (r *reader) vec8() (reader, bool) {
	if len(*r) < 1 || len(*r)-1 < int((*r)[0]) {
		return nil, false
	}
	n := int((*r)[0])
	v := (*r)[1 : 1+n]
	*r = (*r)[1+n:]
	return v, true
}

func (r *reader) vec16() (reader, bool) {
	if len(*r) < 2 {
		return nil, false
	}
	n := int(binary.BigEndian.Uint16(*r))
	if len(*r)-2 < n {
		return nil, false
	}
	v := (*r)[2 : 2+n]
	*r = (*r)[2+n:]
	return v, true
}

// normalizeName returns raw lowercase without one trailing dot if it is a host name as the DNS
// resolver accepts them: at most 253 characters, labels of 1 to 63 letters, digits, '-' or '_'.
// IP addresses are errIPLiteral.
func normalizeName(raw string) (string, error) {
	name := strings.TrimSuffix(raw, ".")
	if name == "" {
		return "", errNoName
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return "", errIPLiteral
	}
	if len(name) > 253 {
		return "", errBadName
	}
	b := []byte(name)
	label := 0
	for i, c := range b {
		switch {
		case c == '.':
			if label == 0 {
				return "", errBadName
			}
			label = 0
			continue
		case 'A' <= c && c <= 'Z':
			b[i] = c + 'a' - 'A'
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_':
		default:
			return "", errBadName
		}
		if label++; label > 63 {
			return "", errBadName
		}
	}
	if label == 0 {
		return "", errBadName
	}
	return string(b), nil
}
