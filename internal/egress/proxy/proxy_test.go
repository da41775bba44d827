package proxy

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Loopback addresses of the test: the sandbox's source, an unknown source, and the backends.
var (
	srcSandbox  = netip.MustParseAddr("127.0.0.2")
	srcSandbox2 = netip.MustParseAddr("127.0.0.3") // a second sandbox, with the same policy
	srcUnknown  = netip.MustParseAddr("127.0.0.9")
	addrHTTP    = netip.MustParseAddr("127.0.0.10")
	addrTLS     = netip.MustParseAddr("127.0.0.11")
	addrBlocked = netip.MustParseAddr("127.0.0.12") // in the test's blocked range
	addrEcho    = netip.MustParseAddr("127.0.0.13")
	addrNowhere = netip.MustParseAddr("127.0.0.20") // nothing listens
)

// testNames are the fake DNS: every name the test resolves. other.test shares the backends'
// addresses with allowed.test, as two sites on one CDN do.
var testNames = map[string][]netip.Addr{
	"allowed.test":   {addrHTTP, addrTLS, addrEcho, addrNowhere},
	"other.test":     {addrHTTP, addrTLS},
	"elsewhere.test": {addrNowhere},
	"internal.test":  {addrBlocked},
}

// testPolicy allows every test name but other.test.
type testPolicy struct{}

func (testPolicy) AllowsName(name string) (bool, string) {
	switch name {
	case "allowed.test", "elsewhere.test", "internal.test", "missing.test", "broken.test":
		return true, "allow " + name
	}
	return false, "default deny"
}

// resolve is the fake Config.Resolve: missing.test does not exist, broken.test fails.
func resolve(ctx context.Context, name string) ([]netip.Addr, error) {
	switch name {
	case "missing.test":
		return nil, errdefs.NotFound("name %s", name)
	case "broken.test":
		return nil, errors.New("upstream timed out")
	}
	return testNames[name], nil
}

// env is a proxy on loopback with its backends. OriginalDst answers dest for every connection.
type env struct {
	p     *Proxy
	addr  netip.AddrPort // the proxy's listener
	pool  *x509.CertPool
	cert  tls.Certificate
	dest  atomic.Pointer[netip.AddrPort]
	block chan Attempt

	httpB, tlsB, blockedB, echoB netip.AddrPort
	blockedAccepts               atomic.Int64
}

func newEnv(t *testing.T, cfg Config) *env {
	t.Helper()
	e := &env{block: make(chan Attempt, 256)}
	e.cert, e.pool = newCert(t, "allowed.test", "other.test", "elsewhere.test", "internal.test")
	e.httpB = serveHTTP(t, addrHTTP, nil)
	e.tlsB = serveHTTP(t, addrTLS, &tls.Config{Certificates: []tls.Certificate{e.cert}})
	e.blockedB = serveTCP(t, addrBlocked, func(c net.Conn) { e.blockedAccepts.Add(1); c.Close() })
	e.echoB = serveTCP(t, addrEcho, func(c net.Conn) {
		defer c.Close()
		b, _ := io.ReadAll(c)
		c.Write(b)
	})
	e.setDest(e.httpB)

	cfg.Resolve = resolve
	cfg.IsBlocked = func(a netip.Addr) bool { return a == addrBlocked }
	cfg.OriginalDst = func(net.Conn) (netip.AddrPort, error) { return *e.dest.Load(), nil }
	lookup := func(src netip.Addr) (Sandbox, bool) {
		switch src {
		case srcSandbox:
			return Sandbox{ID: "sb-1", Policy: testPolicy{}, Blocked: func(a Attempt) { e.block <- a }}, true
		case srcSandbox2:
			return Sandbox{ID: "sb-2", Policy: testPolicy{}}, true
		}
		return Sandbox{}, false
	}
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	p, err := New(cfg, lookup, logger)
	if err != nil {
		t.Fatal(err)
	}
	e.p = p
	t.Cleanup(func() { p.Close() })
	if e.addr, err = p.Listen(netip.MustParseAddrPort("127.0.0.1:0")); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) setDest(d netip.AddrPort) { e.dest.Store(&d) }

// dial connects to the proxy from src.
func (e *env) dial(t *testing.T, src netip.Addr) *net.TCPConn {
	t.Helper()
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), Timeout: 5 * time.Second}
	c, err := d.Dial("tcp4", e.addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c.(*net.TCPConn)
}

// client returns an HTTP client whose every connection goes through the proxy from the sandbox.
func (e *env) client(t *testing.T) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(srcSandbox, 0))}
			return d.DialContext(ctx, "tcp4", e.addr.String())
		},
		TLSClientConfig:   &tls.Config{RootCAs: e.pool},
		DisableKeepAlives: true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// get fetches url through the proxy and returns the status and body.
func (e *env) get(t *testing.T, url string) (int, string, error) {
	resp, err := e.client(t).Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// wantBlocked waits for the next Attempt and compares it with want.
func (e *env) wantBlocked(t *testing.T, want Attempt) {
	t.Helper()
	want.Proto = "tcp"
	select {
	case got := <-e.block:
		if got != want {
			t.Errorf("Blocked(%+v), want %+v", got, want)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("no Blocked call, want %+v", want)
	}
}

// wantNoBlocked checks that no Attempt is waiting.
func (e *env) wantNoBlocked(t *testing.T) {
	t.Helper()
	select {
	case got := <-e.block:
		t.Errorf("unexpected Blocked(%+v)", got)
	default:
	}
}

// waitStats polls the proxy's stats until ok accepts them.
func (e *env) waitStats(t *testing.T, what string, ok func(Stats) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s := e.p.Stats()
		if ok(s) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats never showed %s: %+v", what, s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// newCert returns a self-signed certificate for names and a pool that trusts it.
func newCert(t *testing.T, names ...string) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: names[0]},
		DNSNames:              names,
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// serveHTTP starts an HTTP server (HTTPS with tlsCfg) on addr. It answers "<scheme> <Host or
// SNI> <path>"; /stream sends ten lines 100ms apart.
func serveHTTP(t *testing.T, addr netip.Addr, tlsCfg *tls.Config) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp4", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	bound := ln.Addr().(*net.TCPAddr).AddrPort()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			for i := range 10 {
				fmt.Fprintf(w, "line %d\n", i)
				w.(http.Flusher).Flush()
				time.Sleep(100 * time.Millisecond)
			}
			return
		}
		if r.TLS != nil {
			fmt.Fprintf(w, "https %s %s", r.TLS.ServerName, r.URL.Path)
			return
		}
		fmt.Fprintf(w, "http %s %s", r.Host, r.URL.Path)
	}), TLSConfig: tlsCfg, ErrorLog: log.New(io.Discard, "", 0)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if tlsCfg != nil {
			srv.ServeTLS(ln, "", "")
		} else {
			srv.Serve(ln)
		}
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return bound
}

// serveTCP starts a TCP server on addr that hands each connection to handle.
func serveTCP(t *testing.T, addr netip.Addr, handle func(net.Conn)) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp4", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { handle(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// rawHTTP sends req through the proxy from the sandbox and returns the response.
func (e *env) rawHTTP(t *testing.T, req string) (*http.Response, string) {
	t.Helper()
	c := e.dial(t, srcSandbox)
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestHTTPAllowed(t *testing.T) {
	e := newEnv(t, Config{})
	code, body, err := e.get(t, "http://allowed.test/hello")
	if err != nil || code != 200 || body != "http allowed.test /hello" {
		t.Fatalf("GET = %d %q, %v; want 200 %q", code, body, err, "http allowed.test /hello")
	}
	// Absolute-form naming the Host's host is fine too.
	if resp, body := e.rawHTTP(t, "GET http://allowed.test/abs HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n"); resp.StatusCode != 200 || body != "http allowed.test /abs" {
		t.Errorf("absolute-form: %s %q", resp.Status, body)
	}
	e.waitStats(t, "2 allowed with bytes counted", func(s Stats) bool {
		return s.Allowed == 2 && s.BytesUp > 0 && s.BytesDown > 0 && s.Open == 0
	})
	e.wantNoBlocked(t)
}

func TestHTTPRefused(t *testing.T) {
	e := newEnv(t, Config{})
	tests := []struct {
		name string
		dest netip.AddrPort
		req  string
		want Attempt
	}{
		{"name not allowed", e.httpB, "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n",
			Attempt{Reason: ReasonSNIMismatch, Name: "other.test"}},
		{"absolute-form mismatch", e.httpB, "GET http://other.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
			Attempt{Reason: ReasonSNIMismatch, Name: "other.test"}},
		{"not the name's address", e.httpB, "GET / HTTP/1.1\r\nHost: elsewhere.test\r\n\r\n",
			Attempt{Reason: ReasonNameAddressMismatch, Name: "elsewhere.test"}},
		{"name does not exist", e.httpB, "GET / HTTP/1.1\r\nHost: missing.test\r\n\r\n",
			Attempt{Reason: ReasonNameAddressMismatch, Name: "missing.test"}},
		{"blocked range", e.blockedB, "GET / HTTP/1.1\r\nHost: internal.test\r\n\r\n",
			Attempt{Reason: ReasonBlockedRange, Name: "internal.test"}},
		{"no Host", e.httpB, "GET / HTTP/1.0\r\n\r\n", Attempt{Reason: ReasonNoSNI}},
		{"IP address", e.httpB, "GET / HTTP/1.1\r\nHost: 127.0.0.10\r\n\r\n", Attempt{Reason: ReasonNoSNI}},
		{"two Hosts", e.httpB, "GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: other.test\r\n\r\n", Attempt{Reason: ReasonNoSNI}},
		{"not HTTP", e.httpB, "SSH-2.0-OpenSSH_9.6\r\n", Attempt{Reason: ReasonNoSNI}},
		{"header over MaxPeek", e.httpB, "GET / HTTP/1.1\r\nHost: allowed.test\r\nX: " + strings.Repeat("x", DefaultMaxPeek) + "\r\n\r\n",
			Attempt{Reason: ReasonNoSNI}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e.setDest(tt.dest)
			resp, body := e.rawHTTP(t, tt.req)
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, tt.want.Reason) {
				t.Errorf("response %s %q, want 403 naming %s", resp.Status, body, tt.want.Reason)
			}
			tt.want.Dest = tt.dest
			e.wantBlocked(t, tt.want)
		})
	}
	if n := e.blockedAccepts.Load(); n != 0 {
		t.Errorf("the blocked backend got %d connections", n)
	}
	s := e.p.Stats()
	if want := map[string]uint64{ReasonSNIMismatch: 2, ReasonNameAddressMismatch: 2, ReasonBlockedRange: 1, ReasonNoSNI: 5}; fmt.Sprint(s.Refused) != fmt.Sprint(want) {
		t.Errorf("Refused = %v, want %v", s.Refused, want)
	}
	if s.Allowed != 0 || s.BytesUp != 0 {
		t.Errorf("stats %+v, want nothing allowed", s)
	}
}

func TestTLSAllowed(t *testing.T) {
	e := newEnv(t, Config{})
	e.setDest(e.tlsB)
	code, body, err := e.get(t, "https://allowed.test/secure")
	if err != nil || code != 200 || body != "https allowed.test /secure" {
		t.Fatalf("GET = %d %q, %v; want 200 %q", code, body, err, "https allowed.test /secure")
	}
	e.waitStats(t, "1 allowed", func(s Stats) bool { return s.Allowed == 1 && s.Open == 0 })
	e.wantNoBlocked(t)
}

func TestTLSRefused(t *testing.T) {
	e := newEnv(t, Config{})
	tests := []struct {
		name string
		dest netip.AddrPort
		sni  string // "" sends none
		want Attempt
	}{
		{"name not allowed", e.tlsB, "other.test", Attempt{Reason: ReasonSNIMismatch, Name: "other.test"}},
		{"not the name's address", e.tlsB, "elsewhere.test", Attempt{Reason: ReasonNameAddressMismatch, Name: "elsewhere.test"}},
		{"blocked range", e.blockedB, "internal.test", Attempt{Reason: ReasonBlockedRange, Name: "internal.test"}},
		{"no SNI", e.tlsB, "", Attempt{Reason: ReasonNoSNI}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e.setDest(tt.dest)
			c := e.dial(t, srcSandbox)
			err := tls.Client(c, &tls.Config{ServerName: tt.sni, RootCAs: e.pool, InsecureSkipVerify: tt.sni == ""}).Handshake()
			if err == nil || !strings.Contains(err.Error(), "access denied") {
				t.Errorf("handshake: %v, want an access_denied alert", err)
			}
			tt.want.Dest = tt.dest
			e.wantBlocked(t, tt.want)
		})
	}

	// An IP address as server_name, which crypto/tls never sends.
	e.setDest(e.tlsB)
	c := e.dial(t, srcSandbox)
	c.Write(buildClientHello(helloSpec{names: [][]string{{"127.0.0.11"}}}))
	if b, _ := io.ReadAll(c); string(b) != string(alert(alertAccessDenied)) {
		t.Errorf("read %x, want the alert %x", b, alert(alertAccessDenied))
	}
	e.wantBlocked(t, Attempt{Reason: ReasonNoSNI, Dest: e.tlsB})

	// A resolver failure judges nothing: the connection is closed.
	c = e.dial(t, srcSandbox)
	if err := tls.Client(c, &tls.Config{ServerName: "broken.test", RootCAs: e.pool}).Handshake(); err == nil || !strings.Contains(err.Error(), "internal error") {
		t.Errorf("handshake for broken.test: %v, want an internal_error alert", err)
	}
	e.wantNoBlocked(t)
	if n := e.blockedAccepts.Load(); n != 0 {
		t.Errorf("the blocked backend got %d connections", n)
	}
	e.waitStats(t, "the refusals and a resolve error", func(s Stats) bool {
		return s.ResolveErrors == 1 && s.Refused[ReasonNoSNI] == 2 && s.Refused[ReasonSNIMismatch] == 1 &&
			s.Refused[ReasonNameAddressMismatch] == 1 && s.Refused[ReasonBlockedRange] == 1 && s.Allowed == 0
	})
}

func TestUnknownSource(t *testing.T) {
	e := newEnv(t, Config{})
	c := e.dial(t, srcUnknown)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	if b, err := io.ReadAll(c); len(b) != 0 {
		t.Errorf("read %q, %v; want the connection closed", b, err)
	}
	e.waitStats(t, "an unknown source", func(s Stats) bool { return s.UnknownSource == 1 && s.Allowed == 0 })
	e.wantNoBlocked(t)
}

func TestNoOriginalDst(t *testing.T) {
	e := newEnv(t, Config{})
	for _, dst := range []netip.AddrPort{e.addr, netip.MustParseAddrPort("[::1]:80"), {}} {
		e.setDest(dst)
		c := e.dial(t, srcSandbox)
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
		if b, _ := io.ReadAll(c); len(b) != 0 {
			t.Errorf("original destination %v: read %q, want the connection closed", dst, b)
		}
	}
	e.waitStats(t, "3 without original destination", func(s Stats) bool { return s.NoOriginalDst == 3 })
	e.wantNoBlocked(t)
}

func TestDialError(t *testing.T) {
	e := newEnv(t, Config{DialTimeout: time.Second})
	e.setDest(netip.AddrPortFrom(addrNowhere, 80))
	resp, _ := e.rawHTTP(t, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("response %s, want 502", resp.Status)
	}
	e.waitStats(t, "a dial error", func(s Stats) bool { return s.DialErrors == 1 && s.Allowed == 0 })
	e.wantNoBlocked(t)
}

func TestPeekTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	e := newEnv(t, Config{PeekTimeout: timeout})
	start := time.Now()
	silent := e.dial(t, srcSandbox)
	// A slow sender is cut at the timeout, however steadily it sends.
	slow := e.dial(t, srcSandbox)
	io.WriteString(slow, "GET / HTTP/1.1\r\nHost: allowed.test\r\n")
	go func() {
		for range 100 {
			if _, err := io.WriteString(slow, "X: y\r\n"); err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	partialTLS := e.dial(t, srcSandbox)
	partialTLS.Write(buildClientHello(helloSpec{names: [][]string{{"allowed.test"}}})[:20])
	for name, c := range map[string]net.Conn{"silent": silent, "slow": slow, "partial ClientHello": partialTLS} {
		b, _ := io.ReadAll(c)
		if len(b) != 0 {
			t.Errorf("%s: read %q, want the connection closed", name, b)
		}
		if d := time.Since(start); d < timeout || d > timeout+3*time.Second {
			t.Errorf("%s: closed after %v, want about %v", name, d, timeout)
		}
	}
	e.waitStats(t, "3 incomplete", func(s Stats) bool { return s.Incomplete == 3 && s.Open == 0 })
	e.wantNoBlocked(t)
}

func TestHalfClose(t *testing.T) {
	e := newEnv(t, Config{})
	e.setDest(e.echoB)
	c := e.dial(t, srcSandbox)
	req := "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\nand a body after the header"
	io.WriteString(c, req)
	c.CloseWrite()
	// The echo server answers only after it read EOF, so the half-close went through.
	if b, err := io.ReadAll(c); string(b) != req || err != nil {
		t.Errorf("echo = %q, %v; want %q", b, err, req)
	}
	e.waitStats(t, "the bytes", func(s Stats) bool {
		return s.BytesUp == uint64(len(req)) && s.BytesDown == uint64(len(req)) && s.Open == 0
	})
}

func TestIdleTimeout(t *testing.T) {
	const idle = 300 * time.Millisecond
	e := newEnv(t, Config{IdleTimeout: idle})
	// A response that takes a second, sent in bits, is not idle although the client says nothing.
	code, body, err := e.get(t, "http://allowed.test/stream")
	if err != nil || code != 200 || strings.Count(body, "\n") != 10 {
		t.Fatalf("stream: %d %q, %v", code, body, err)
	}
	// A kept-alive connection with nothing moving is closed.
	c := e.dial(t, srcSandbox)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	start := time.Now()
	if b, err := io.ReadAll(br); len(b) != 0 || err != nil {
		t.Errorf("read %q, %v; want the connection closed", b, err)
	}
	if d := time.Since(start); d > idle+3*time.Second {
		t.Errorf("closed after %v idle, want about %v", d, idle)
	}
}

func TestConcurrent(t *testing.T) {
	e := newEnv(t, Config{})
	const n = 40
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		wg.Go(func() {
			url := fmt.Sprintf("http://allowed.test/%d", i)
			code, body, err := e.get(t, url)
			if err != nil || code != 200 || body != fmt.Sprintf("http allowed.test /%d", i) {
				errs <- fmt.Errorf("GET %s = %d %q, %v", url, code, body, err)
			}
		})
		wg.Go(func() {
			code, _, err := e.get(t, "http://other.test/")
			if err != nil || code != http.StatusForbidden {
				errs <- fmt.Errorf("GET other.test = %d, %v; want 403", code, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	e.waitStats(t, "all judged", func(s Stats) bool {
		return s.Allowed == n && s.Refused[ReasonSNIMismatch] == n && s.Open == 0
	})
}

func TestMaxConns(t *testing.T) {
	e := newEnv(t, Config{MaxConns: 3, MaxConnsPerSandbox: 2, PeekTimeout: time.Minute})
	wantClosed := func(c net.Conn) {
		t.Helper()
		if b, _ := io.ReadAll(c); len(b) != 0 {
			t.Errorf("read %q, want the connection closed", b)
		}
	}
	e.dial(t, srcSandbox)
	e.dial(t, srcSandbox)
	e.waitStats(t, "2 open", func(s Stats) bool { return s.Open == 2 })
	wantClosed(e.dial(t, srcSandbox)) // over sb-1's limit
	e.dial(t, srcSandbox2)            // sb-2 is not held back by sb-1
	e.waitStats(t, "3 open", func(s Stats) bool { return s.Open == 3 && s.Overloaded == 1 })
	wantClosed(e.dial(t, srcSandbox2)) // over the proxy's limit
	e.waitStats(t, "2 overloaded", func(s Stats) bool { return s.Overloaded == 2 && s.Accepted == 5 })
}

func TestClose(t *testing.T) {
	e := newEnv(t, Config{PeekTimeout: time.Minute})
	// A spliced TLS connection, idle after its handshake, and one waiting for its ClientHello.
	e.setDest(e.tlsB)
	spliced := tls.Client(e.dial(t, srcSandbox), &tls.Config{ServerName: "allowed.test", RootCAs: e.pool})
	if err := spliced.Handshake(); err != nil {
		t.Fatal(err)
	}
	waiting := e.dial(t, srcSandbox)
	e.waitStats(t, "2 open", func(s Stats) bool { return s.Open == 2 })

	start := time.Now()
	if err := e.p.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %v", d)
	}
	for name, c := range map[string]net.Conn{"spliced": spliced, "waiting": waiting} {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Errorf("%s: read after Close: %v, want the connection closed", name, err)
		}
	}
	if s := e.p.Stats(); s.Open != 0 {
		t.Errorf("%d open after Close", s.Open)
	}
	if _, err := e.p.Listen(netip.MustParseAddrPort("127.0.0.1:0")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Listen after Close: %v, want net.ErrClosed", err)
	}
	if _, err := net.DialTimeout("tcp4", e.addr.String(), time.Second); err == nil {
		t.Error("the listener still accepts after Close")
	}
	if err := e.p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// isTimeout reports whether err is a read that ended at its deadline.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestListen(t *testing.T) {
	e := newEnv(t, Config{})
	if _, err := e.p.Listen(e.addr); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Listen twice: %v, want a conflict", err)
	}
	if _, err := e.p.Listen(netip.MustParseAddrPort("[::1]:0")); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Listen on IPv6: %v, want invalid", err)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{Resolve: resolve}
	tests := []struct {
		field string
		edit  func(*Config)
	}{
		{"", func(*Config) {}},
		{"proxy.resolve", func(c *Config) { c.Resolve = nil }},
		{"proxy.dial_timeout", func(c *Config) { c.DialTimeout = -1 }},
		{"proxy.peek_timeout", func(c *Config) { c.PeekTimeout = -1 }},
		{"proxy.resolve_timeout", func(c *Config) { c.ResolveTimeout = -1 }},
		{"proxy.idle_timeout", func(c *Config) { c.IdleTimeout = -1 }},
		{"proxy.max_peek", func(c *Config) { c.MaxPeek = 100 }},
		{"proxy.max_peek", func(c *Config) { c.MaxPeek = 2 << 20 }},
		{"proxy.max_conns", func(c *Config) { c.MaxConns = -1 }},
		{"proxy.max_conns_per_sandbox", func(c *Config) { c.MaxConnsPerSandbox = -1 }},
	}
	for _, tt := range tests {
		c := ok
		tt.edit(&c)
		err := c.Validate()
		if got := errdefs.Field(err); got != tt.field || (tt.field != "" && !errors.Is(err, errdefs.ErrInvalid)) {
			t.Errorf("Validate() = %v, want field %q", err, tt.field)
		}
	}
	if _, err := New(ok, nil, nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("New without lookup: %v, want invalid", err)
	}
}

func TestDefaultIsBlocked(t *testing.T) {
	for a, want := range map[string]bool{
		"127.0.0.1": true, "10.1.2.3": true, "172.16.0.1": true, "192.168.1.1": true, "169.254.169.254": true,
		"100.100.100.200": true, "0.0.0.0": true, "224.0.0.1": true, "255.255.255.255": true, "240.0.0.1": true,
		"::1": true, "fe80::1": true, "fd00::1": true, "::ffff:10.0.0.1": true,
		"1.1.1.1": false, "93.184.215.14": false, "198.51.100.7": false, "2606:4700::1111": false,
	} {
		if got := DefaultIsBlocked(netip.MustParseAddr(a)); got != want {
			t.Errorf("DefaultIsBlocked(%s) = %v, want %v", a, got, want)
		}
	}
}
