package proxy

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// captureClientHello returns the first record crypto/tls sends as a client with cfg: its
// ClientHello, which fits one record.
func captureClientHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	c, s := net.Pipe()
	defer s.Close()
	go func() {
		tls.Client(c, cfg).Handshake()
		c.Close()
	}()
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	hdr := make([]byte, recordHeaderLen)
	if _, err := io.ReadFull(s, hdr); err != nil {
		t.Fatal(err)
	}
	rec := make([]byte, recordHeaderLen+int(binary.BigEndian.Uint16(hdr[3:5])))
	copy(rec, hdr)
	if _, err := io.ReadFull(s, rec[recordHeaderLen:]); err != nil {
		t.Fatal(err)
	}
	return rec
}

// helloSpec describes a hand-built ClientHello.
type helloSpec struct {
	names     [][]string // one server_name extension for each element, with these host_names
	noExts    bool       // no extensions block at all
	trailing  []byte     // bytes after the extensions block, inside the message
	recordLen int        // split the message into records of this many bytes (0: one record)
}

// buildClientHello returns the records of a minimal ClientHello after spec.
func buildClientHello(spec helloSpec) []byte {
	var body []byte
	body = append(body, 3, 3)                 // legacy_version
	body = append(body, make([]byte, 32)...)  // random
	body = append(body, 0)                    // session id
	body = append(body, 0, 2, 0x13, 0x01)     // cipher suites
	body = append(body, 1, 0)                 // compression methods
	exts := []byte{0x00, 0x2b, 0, 3, 2, 3, 4} // supported_versions: TLS 1.3
	for _, names := range spec.names {
		var list []byte
		for _, n := range names {
			list = append(list, nameTypeHostName)
			list = binary.BigEndian.AppendUint16(list, uint16(len(n)))
			list = append(list, n...)
		}
		ext := binary.BigEndian.AppendUint16(nil, uint16(len(list)))
		ext = append(ext, list...)
		exts = binary.BigEndian.AppendUint16(exts, extServerName)
		exts = binary.BigEndian.AppendUint16(exts, uint16(len(ext)))
		exts = append(exts, ext...)
	}
	if !spec.noExts {
		body = binary.BigEndian.AppendUint16(body, uint16(len(exts)))
		body = append(body, exts...)
	}
	body = append(body, spec.trailing...)
	msg := []byte{handshakeTypeClientHello, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}
	msg = append(msg, body...)
	size := spec.recordLen
	if size == 0 {
		size = len(msg)
	}
	var out []byte
	for len(msg) > 0 {
		n := min(size, len(msg))
		out = append(out, recordTypeHandshake, 3, 1)
		out = binary.BigEndian.AppendUint16(out, uint16(n))
		out = append(out, msg[:n]...)
		msg = msg[n:]
	}
	return out
}

// refragment splits the handshake message in the single record rec into records of size bytes.
func refragment(rec []byte, size int) []byte {
	msg := rec[recordHeaderLen:]
	var out []byte
	for len(msg) > 0 {
		n := min(size, len(msg))
		out = append(out, rec[0], rec[1], rec[2])
		out = binary.BigEndian.AppendUint16(out, uint16(n))
		out = append(out, msg[:n]...)
		msg = msg[n:]
	}
	return out
}

func TestParseClientHello(t *testing.T) {
	long := strings.Repeat("a", 63) + ".test"
	real13 := captureClientHello(t, &tls.Config{ServerName: "Allowed.Test"})
	tests := []struct {
		name     string
		data     []byte
		want     string
		wantErr  error
		complete bool // every strict prefix is errIncomplete
	}{
		{"crypto/tls 1.3", real13, "allowed.test", nil, true},
		{"crypto/tls 1.2", captureClientHello(t, &tls.Config{ServerName: "allowed.test", MaxVersion: tls.VersionTLS12}), "allowed.test", nil, true},
		{"crypto/tls no SNI", captureClientHello(t, &tls.Config{InsecureSkipVerify: true}), "", errNoName, true},
		{"crypto/tls IP address", captureClientHello(t, &tls.Config{ServerName: "192.0.2.1", InsecureSkipVerify: true}), "", errNoName, true},
		{"fragmented 1-byte records", refragment(real13, 1), "allowed.test", nil, true},
		{"fragmented 100-byte records", refragment(real13, 100), "allowed.test", nil, true},
		{"built", buildClientHello(helloSpec{names: [][]string{{"allowed.test"}}}), "allowed.test", nil, true},
		{"built fragmented", buildClientHello(helloSpec{names: [][]string{{"allowed.test"}}, recordLen: 3}), "allowed.test", nil, true},
		{"trailing dot", buildClientHello(helloSpec{names: [][]string{{"allowed.test."}}}), "allowed.test", nil, true},
		{"63-byte label", buildClientHello(helloSpec{names: [][]string{{long}}}), long, nil, true},
		{"64-byte label", buildClientHello(helloSpec{names: [][]string{{"a" + long}}}), "", errBadName, true},
		{"IP literal", buildClientHello(helloSpec{names: [][]string{{"127.0.0.1"}}}), "", errIPLiteral, true},
		{"IPv6 literal", buildClientHello(helloSpec{names: [][]string{{"::1"}}}), "", errIPLiteral, true},
		{"NUL in name", buildClientHello(helloSpec{names: [][]string{{"allowed.test\x00.evil"}}}), "", errBadName, true},
		{"empty label", buildClientHello(helloSpec{names: [][]string{{"allowed..test"}}}), "", errBadName, true},
		{"no extensions", buildClientHello(helloSpec{noExts: true}), "", errNoName, true},
		{"no server_name", buildClientHello(helloSpec{}), "", errNoName, true},
		{"two server_name extensions", buildClientHello(helloSpec{names: [][]string{{"allowed.test"}, {"other.test"}}}), "", errMalformed, true},
		{"two host_names", buildClientHello(helloSpec{names: [][]string{{"allowed.test", "other.test"}}}), "", errMalformed, true},
		{"empty host_name", buildClientHello(helloSpec{names: [][]string{{""}}}), "", errMalformed, true},
		{"empty server_name list", buildClientHello(helloSpec{names: [][]string{{}}}), "", errMalformed, true},
		{"bytes after extensions", buildClientHello(helloSpec{names: [][]string{{"allowed.test"}}, trailing: []byte{0}}), "", errMalformed, true},
		{"HTTP", []byte("GET / HTTP/1.1\r\n"), "", errMalformed, false},
		{"SSLv2 hello", []byte{0x80, 0x2e, 0x01, 0x03, 0x01}, "", errMalformed, false},
		{"alert record", []byte{21, 3, 3, 0, 2, 2, 40}, "", errMalformed, false},
		{"record version 2", []byte{22, 2, 0, 0, 4}, "", errMalformed, false},
		{"empty record", []byte{22, 3, 1, 0, 0}, "", errMalformed, false},
		{"record too long", []byte{22, 3, 1, 0x40, 0x01}, "", errMalformed, false},
		{"ServerHello", []byte{22, 3, 3, 0, 4, 2, 0, 0, 0}, "", errMalformed, false},
		{"empty", nil, "", errIncomplete, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			orig := bytes.Clone(tt.data)
			got, need, err := parseClientHello(tt.data)
			if got != tt.want || !errors.Is(err, tt.wantErr) {
				t.Errorf("parseClientHello = %q, %v; want %q, %v", got, err, tt.want, tt.wantErr)
			}
			if !bytes.Equal(tt.data, orig) {
				t.Errorf("parseClientHello modified its input")
			}
			if err == errIncomplete && need <= len(tt.data) {
				t.Errorf("need %d with %d bytes", need, len(tt.data))
			}
			if !tt.complete {
				return
			}
			for i := range len(tt.data) {
				_, need, err := parseClientHello(tt.data[:i])
				if err != errIncomplete || need <= i || need > len(tt.data) {
					t.Fatalf("prefix of %d of %d bytes: need %d, err %v; want errIncomplete and a need in (%d, %d]",
						i, len(tt.data), need, err, i, len(tt.data))
				}
			}
			// Bytes after the ClientHello (early data) do not matter.
			if got2, _, err2 := parseClientHello(append(bytes.Clone(tt.data), 23, 3, 3, 0, 1, 0)); got2 != got || err2 != err {
				t.Errorf("with a record after it: %q, %v; want %q, %v", got2, err2, got, err)
			}
		})
	}
}

func TestParseHTTPHost(t *testing.T) {
	tests := []struct {
		name    string
		data    string
		want    string
		wantErr error
	}{
		{"origin-form", "GET /x HTTP/1.1\r\nHost: Allowed.Test\r\n\r\n", "allowed.test", nil},
		{"port and dot", "GET / HTTP/1.1\r\nUser-Agent: x\r\nhost:allowed.test.:8080 \r\n\r\nbody", "allowed.test", nil},
		{"tab around value", "POST / HTTP/1.0\r\nHost:\t allowed.test\t\r\n\r\n", "allowed.test", nil},
		{"absolute-form", "GET http://allowed.test/x?y HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "allowed.test", nil},
		{"absolute-form without Host", "GET HTTP://Allowed.Test:80 HTTP/1.0\r\n\r\n", "allowed.test", nil},
		{"absolute-form mismatch", "GET http://other.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "other.test", errHostMismatch},
		{"absolute-form userinfo", "GET http://allowed.test@other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n", "", errMalformed},
		{"authority-form", "CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n", "allowed.test", nil},
		{"authority-form mismatch", "CONNECT other.test:443 HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "other.test", errHostMismatch},
		{"asterisk-form", "OPTIONS * HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "allowed.test", nil},
		{"no Host", "GET / HTTP/1.0\r\nAccept: */*\r\n\r\n", "", errNoName},
		{"empty Host", "GET / HTTP/1.1\r\nHost:\r\n\r\n", "", errNoName},
		{"IPv4 Host", "GET / HTTP/1.1\r\nHost: 192.0.2.1:80\r\n\r\n", "", errIPLiteral},
		{"IPv6 Host", "GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n", "", errIPLiteral},
		{"unbracketed IPv6 Host", "GET / HTTP/1.1\r\nHost: ::1\r\n\r\n", "", errMalformed},
		{"bad port", "GET / HTTP/1.1\r\nHost: allowed.test:80x\r\n\r\n", "", errMalformed},
		{"path in Host", "GET / HTTP/1.1\r\nHost: evil.test/allowed.test\r\n\r\n", "", errBadName},
		{"two Hosts", "GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: other.test\r\n\r\n", "", errMalformed},
		{"space before colon", "GET / HTTP/1.1\r\nHost : other.test\r\nHost: allowed.test\r\n\r\n", "", errMalformed},
		{"folded line", "GET / HTTP/1.1\r\nX: a\r\n Host: other.test\r\nHost: allowed.test\r\n\r\n", "", errMalformed},
		{"bare LF", "GET / HTTP/1.1\nHost: allowed.test\n\n", "", errMalformed},
		{"bare CR", "GET / HTTP/1.1\r\nHost: allowed.test\rX: y\r\n\r\n", "", errMalformed},
		{"NUL in value", "GET / HTTP/1.1\r\nHost: allowed.test\x00.evil\r\n\r\n", "", errMalformed},
		{"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "", errMalformed},
		{"two spaces", "GET  / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "", errMalformed},
		{"leading empty line", "\r\nGET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "", errMalformed},
		{"SSH", "SSH-2.0-OpenSSH_9.6\r\n", "", errMalformed},
		{"binary", "\x00\x01\x02", "", errMalformed},
		{"long method", strings.Repeat("A", 30), "", errMalformed},
		{"partial request line", "GET /very/long/pa", "", errIncomplete},
		{"partial method", "GE", "", errIncomplete},
		{"partial header", "GET / HTTP/1.1\r\nHost: allowed.test\r", "", errIncomplete},
		{"no end", "GET / HTTP/1.1\r\nHost: allowed.test\r\n", "", errIncomplete},
		{"empty", "", "", errIncomplete},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseHTTPHost([]byte(tt.data))
			if got != tt.want || !errors.Is(err, tt.wantErr) {
				t.Errorf("parseHTTPHost(%q) = %q, %v; want %q, %v", tt.data, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestNormalizeName(t *testing.T) {
	tests := []struct {
		raw, want string
		wantErr   error
	}{
		{"Allowed.TEST.", "allowed.test", nil},
		{"a_b-c.test", "a_b-c.test", nil},
		{"localhost", "localhost", nil},
		{strings.Repeat("a.", 126) + "a", strings.Repeat("a.", 126) + "a", nil},
		{strings.Repeat("a.", 126) + "ab", "", errBadName},
		{"", "", errNoName},
		{".", "", errNoName},
		{"a..", "", errBadName},
		{".a", "", errBadName},
		{"é.test", "", errBadName},
		{"a b.test", "", errBadName},
		{"10.0.0.1", "", errIPLiteral},
		{"fe80::1%eth0", "", errIPLiteral},
	}
	for _, tt := range tests {
		got, err := normalizeName(tt.raw)
		if got != tt.want || !errors.Is(err, tt.wantErr) {
			t.Errorf("normalizeName(%q) = %q, %v; want %q, %v", tt.raw, got, err, tt.want, tt.wantErr)
		}
	}
}
