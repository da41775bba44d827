package proxy

import (
	"bytes"
	"crypto/tls"
	"net/netip"
	"testing"
)

// checkName fails t unless name is what the parsers may pass to a policy: a normalized host
// name, no IP address.
func checkName(t *testing.T, name string) {
	t.Helper()
	if n, err := normalizeName(name); err != nil || n != name {
		t.Errorf("name %q passed, normalizes to %q, %v", name, n, err)
	}
	if _, err := netip.ParseAddr(name); err == nil {
		t.Errorf("IP address %q passed as a name", name)
	}
}

// FuzzParseClientHello feeds arbitrary bytes to parseClientHello and checks that it never
// panics nor modifies its input, passes only normalized host names, and asks for more bytes only
// with a need beyond what it has.
//
//	go test -run '^$' -fuzz FuzzParseClientHello -fuzztime 60s ./internal/egress/proxy
func FuzzParseClientHello(f *testing.F) {
	real13 := captureClientHello(f, &tls.Config{ServerName: "allowed.test"})
	for _, seed := range [][]byte{
		real13,
		refragment(real13, 7),
		captureClientHello(f, &tls.Config{ServerName: "allowed.test", MaxVersion: tls.VersionTLS12}),
		captureClientHello(f, &tls.Config{InsecureSkipVerify: true}),
		buildClientHello(helloSpec{names: [][]string{{"allowed.test"}}}),
		buildClientHello(helloSpec{names: [][]string{{"allowed.test", "other.test"}}}),
		buildClientHello(helloSpec{names: [][]string{{"a.test"}, {"b.test"}}, recordLen: 5}),
		buildClientHello(helloSpec{noExts: true}),
		{22, 3, 1, 0, 4, 1, 0, 0, 0},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		orig := bytes.Clone(data)
		name, need, err := parseClientHello(data)
		if !bytes.Equal(data, orig) {
			t.Fatal("input modified")
		}
		switch err {
		case nil:
			checkName(t, name)
		case errIncomplete:
			if need <= len(data) {
				t.Errorf("need %d with %d bytes", need, len(data))
			}
		case errMalformed, errNoName, errIPLiteral, errBadName:
		default:
			t.Errorf("unexpected error %v", err)
		}
		if err != nil && name != "" {
			t.Errorf("name %q with error %v", name, err)
		}
	})
}

// FuzzParseHTTPHost feeds arbitrary bytes to parseHTTPHost and checks that it never panics,
// passes only normalized host names, and always decides once a header block is complete.
//
//	go test -run '^$' -fuzz FuzzParseHTTPHost -fuzztime 60s ./internal/egress/proxy
func FuzzParseHTTPHost(f *testing.F) {
	for _, seed := range []string{
		"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"GET http://other.test/ HTTP/1.1\r\nHost: allowed.test:80\r\nAccept: */*\r\n\r\n",
		"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"OPTIONS * HTTP/1.0\r\nHost: [::1]\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
		"GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: allowed.test\r\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		orig := bytes.Clone(data)
		name, err := parseHTTPHost(data)
		if !bytes.Equal(data, orig) {
			t.Fatal("input modified")
		}
		switch err {
		case nil:
			checkName(t, name)
		case errHostMismatch:
			checkName(t, name)
		case errIncomplete:
			if bytes.Contains(data, []byte("\r\n\r\n")) {
				t.Errorf("incomplete with a whole header block")
			}
		case errMalformed, errNoName, errIPLiteral, errBadName:
			if name != "" {
				t.Errorf("name %q with error %v", name, err)
			}
		default:
			t.Errorf("unexpected error %v", err)
		}
	})
}
