package clusterauth

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/doccheck"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/model"
)

func TestDocs(t *testing.T) { doccheck.Exported(t, ".") }

// newCA makes and loads a CA valid for a day.
func newCA(t *testing.T, name string) (*CA, []byte) {
	t.Helper()
	certPEM, keyPEM, err := NewCA(name, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := LoadCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return ca, certPEM
}

// edgeCert joins node the way an edge does: its own key and CSR, signed by ca.
func edgeCert(t *testing.T, ca *CA, node string, ttl time.Duration) (certPEM, keyPEM []byte) {
	t.Helper()
	keyPEM, csrPEM, err := NewCSR(node)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err = ca.SignEdge(csrPEM, node, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return certPEM, keyPEM
}

// craft signs tmpl for a fresh key with ca, bypassing the role rules of SignEdge and
// IssueServer, to make certificates the CA never issues.
func craft(t *testing.T, ca *CA, tmpl *x509.Certificate) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if certPEM, err = ca.sign(tmpl, &key.PublicKey, time.Hour); err != nil {
		t.Fatal(err)
	}
	if keyPEM, err = encodeKey(key); err != nil {
		t.Fatal(err)
	}
	return certPEM, keyPEM
}

func mustParse(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	cert, err := parseCert(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func TestCARoundTrip(t *testing.T) {
	before := time.Now()
	certPEM, keyPEM, err := NewCA("cluster-ca", 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := LoadCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ca.CertPEM(), certPEM) {
		t.Errorf("CertPEM() differs from the PEM NewCA returned")
	}
	cert := mustParse(t, ca.CertPEM())
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 || cert.Subject.CommonName != "cluster-ca" {
		t.Errorf("CA certificate: IsCA %v, KeyUsage %v, CN %q", cert.IsCA, cert.KeyUsage, cert.Subject.CommonName)
	}
	if _, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok {
		t.Errorf("CA key is %T, want ECDSA", cert.PublicKey)
	}
	exp, err := Expiry(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	if want := before.Add(48 * time.Hour); exp.Before(want.Add(-time.Second)) || exp.After(want.Add(time.Minute)) {
		t.Errorf("Expiry = %s, want about %s", exp, want)
	}

	// Something the CA signed verifies against it.
	edge, _ := edgeCert(t, ca, "edge1", time.Hour)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	if _, err := mustParse(t, edge).Verify(x509.VerifyOptions{Roots: pool, DNSName: "edge1"}); err != nil {
		t.Errorf("edge certificate does not verify against the CA: %v", err)
	}

	_, otherKey, err := NewCA("other", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	edgeKeyPEM := func() []byte { _, k := edgeCert(t, ca, "edge2", time.Hour); return k }()
	for name, tc := range map[string]struct{ cert, key []byte }{
		"key of another CA": {certPEM, otherKey},
		"leaf as CA":        {edge, edgeKeyPEM},
		"garbage cert":      {[]byte("not pem"), keyPEM},
		"garbage key":       {certPEM, []byte("not pem")},
		"key in cert place": {keyPEM, keyPEM},
	} {
		if _, err := LoadCA(tc.cert, tc.key); err == nil {
			t.Errorf("LoadCA with %s: no error", name)
		}
	}
	for _, bad := range []struct {
		name string
		ttl  time.Duration
	}{{"", time.Hour}, {"x", 0}} {
		if _, _, err := NewCA(bad.name, bad.ttl); err == nil {
			t.Errorf("NewCA(%q, %s): no error", bad.name, bad.ttl)
		}
	}
}

func TestSignEdgeTakesIdentityFromNode(t *testing.T) {
	ca, _ := newCA(t, "ca")
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	// The request claims another node, the server role and an IP address.
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: "edge2", OrganizationalUnit: []string{RoleServer}},
		DNSNames:    []string{"edge2", "evil.example"},
		IPAddresses: []net.IP{net.IPv4(10, 0, 0, 2)},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	csrPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	start := time.Now()
	certPEM, err := ca.SignEdge(csrPEM, "edge1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert := mustParse(t, certPEM)
	if got := cert.Subject.CommonName; got != "edge1" {
		t.Errorf("CN = %q, want edge1", got)
	}
	if got := cert.DNSNames; !slices.Equal(got, []string{"edge1"}) {
		t.Errorf("DNS names = %q, want [edge1]", got)
	}
	if len(cert.IPAddresses) != 0 {
		t.Errorf("IP addresses = %v, want none", cert.IPAddresses)
	}
	if got := cert.Subject.OrganizationalUnit; !slices.Equal(got, []string{RoleEdge}) {
		t.Errorf("OU = %q, want [%s]", got, RoleEdge)
	}
	if got := cert.ExtKeyUsage; !slices.Equal(got, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}) {
		t.Errorf("ExtKeyUsage = %v, want ServerAuth and ClientAuth", got)
	}
	if cert.IsCA {
		t.Error("edge certificate is a CA")
	}
	if !publicKeyEqual(&key.PublicKey, cert.PublicKey) {
		t.Error("certificate does not carry the request's public key")
	}
	if lag := start.Sub(cert.NotBefore); lag < 59*time.Second || lag > 2*time.Minute {
		t.Errorf("NotBefore is %s before signing, want about a minute", lag)
	}
	again, err := ca.SignEdge(csrPEM, "edge1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if mustParse(t, again).SerialNumber.Cmp(cert.SerialNumber) == 0 {
		t.Error("two certificates got the same serial number")
	}
}

func TestSignEdgeRefuses(t *testing.T) {
	ca, _ := newCA(t, "ca")
	_, csrPEM, err := NewCSR("edge1")
	if err != nil {
		t.Fatal(err)
	}
	// Changing a signed byte (the name) keeps the request parseable but breaks its signature.
	block, _ := pem.Decode(csrPEM)
	der := bytes.Replace(block.Bytes, []byte("edge1"), []byte("edge9"), 1)
	if bytes.Equal(der, block.Bytes) {
		t.Fatal("test setup: name not found in the request")
	}
	badSig := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	certPEM, _ := edgeCert(t, ca, "edge1", time.Hour)

	expired, _ := newCA(t, "ca")
	expired.now = func() time.Time { return time.Now().Add(25 * time.Hour) }

	for _, tc := range []struct {
		name string
		ca   *CA
		csr  []byte
		node string
		ttl  time.Duration
		want string
	}{
		{"bad signature", ca, badSig, "edge1", time.Hour, "not signed by the key it carries"},
		{"not PEM", ca, []byte("hello"), "edge1", time.Hour, "CERTIFICATE REQUEST"},
		{"a certificate", ca, certPEM, "edge1", time.Hour, "CERTIFICATE REQUEST"},
		{"bad node", ca, csrPEM, "Edge_1", time.Hour, "node name"},
		{"IP as node", ca, csrPEM, "10.0.0.1", time.Hour, "node name"},
		{"empty node", ca, csrPEM, "", time.Hour, "node name"},
		{"the servers' name", ca, csrPEM, ServersName, time.Hour, "servers' certificates"},
		{"no validity", ca, csrPEM, "edge1", 0, "must be positive"},
		{"expired CA", expired, csrPEM, "edge1", time.Hour, "CA expired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.ca.SignEdge(tc.csr, tc.node, tc.ttl)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("SignEdge: got error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestSignEdgeCappedAtCAExpiry(t *testing.T) {
	ca, caPEM := newCA(t, "ca")
	certPEM, _ := edgeCert(t, ca, "edge1", 1000*time.Hour)
	caExp, _ := Expiry(caPEM)
	if exp, _ := Expiry(certPEM); !exp.Equal(caExp) {
		t.Errorf("edge certificate expires %s, after its CA (%s)", exp, caExp)
	}
}

func TestIssueServer(t *testing.T) {
	ca, _ := newCA(t, "ca")
	certPEM, keyPEM, err := ca.IssueServer("replica-a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert := mustParse(t, certPEM)
	if got := cert.Subject.OrganizationalUnit; !slices.Equal(got, []string{RoleServer}) {
		t.Errorf("OU = %q, want [%s]", got, RoleServer)
	}
	if got := cert.ExtKeyUsage; !slices.Equal(got, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}) {
		t.Errorf("ExtKeyUsage = %v, want ClientAuth and ServerAuth", got)
	}
	if cert.Subject.CommonName != "replica-a" || !slices.Equal(cert.DNSNames, []string{ServersName}) {
		t.Errorf("CN %q, DNS names %q; want replica-a and %s", cert.Subject.CommonName, cert.DNSNames, ServersName)
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Errorf("certificate and key do not pair: %v", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("server certificate does not verify as a client: %v", err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: ServersName}); err != nil {
		t.Errorf("server certificate does not verify as the node channel's server: %v", err)
	}
	if _, _, err := ca.IssueServer("", time.Hour); err == nil {
		t.Error("IssueServer with no name: no error")
	}
}

func TestTLSConfigsRefuseWrongFiles(t *testing.T) {
	ca, caPEM := newCA(t, "ca")
	_, otherPEM := newCA(t, "other")
	edge, edgeKey := edgeCert(t, ca, "edge1", time.Hour)
	srv, srvKey, err := ca.IssueServer("r1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		load      func(ca, cert, key []byte) (*tls.Config, error)
		ca        []byte
		cert, key []byte
		want      string
	}{
		{"edge with server cert", EdgeTLS, caPEM, srv, srvKey, "does not carry the corral-edge role"},
		{"server with edge cert", ServerTLS, caPEM, edge, edgeKey, "does not carry the corral-server role"},
		{"edge under other CA", EdgeTLS, otherPEM, edge, edgeKey, "not issued by the cluster CA"},
		{"server under other CA", ServerTLS, otherPEM, srv, srvKey, "not issued by the cluster CA"},
		{"key of another cert", EdgeTLS, caPEM, edge, srvKey, "private key does not match"},
		{"CA not PEM", EdgeTLS, []byte("x"), edge, edgeKey, "no PEM certificate"},
		{"leaf as CA", ServerTLS, edge, srv, srvKey, "not a certificate authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.load(tc.ca, tc.cert, tc.key)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got error %v, want one containing %q", err, tc.want)
			}
		})
	}
	// During a CA change the bundle holds both, and either issuer is accepted.
	if _, err := EdgeTLS(append(bytes.Clone(otherPEM), caPEM...), edge, edgeKey); err != nil {
		t.Errorf("EdgeTLS with a CA bundle: %v", err)
	}
}

// edgeServer starts an edge API on TLS from EdgeTLS, answering "ok" behind RequireServer with
// /healthz exempt.
func edgeServer(t *testing.T, caPEM, certPEM, keyPEM []byte) *httptest.Server {
	t.Helper()
	cfg, err := EdgeTLS(caPEM, certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	hs := httptest.NewUnstartedServer(RequireServer(ok, "/healthz"))
	hs.TLS = cfg
	hs.Config.ErrorLog = log.New(testLog{t}, "edge: ", 0)
	hs.StartTLS()
	t.Cleanup(hs.Close)
	return hs
}

// testLog sends a server's log (refused handshakes) to the test's, shown on failure or -v.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// get calls url with cfg and returns the status, or the error of the call.
func get(cfg *tls.Config, url string) (int, []byte, error) {
	tr := &http.Transport{TLSClientConfig: cfg}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

func TestMutualTLS(t *testing.T) {
	ca, caPEM := newCA(t, "ca")
	edgePEM, edgeKey := edgeCert(t, ca, "edge1", time.Hour)
	hs := edgeServer(t, caPEM, edgePEM, edgeKey)

	serverCfg := func(ca *CA, caPEM []byte) *tls.Config {
		certPEM, keyPEM, err := ca.IssueServer("replica-a", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := ServerTLS(caPEM, certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	good := serverCfg(ca, caPEM)

	noCert := good.Clone()
	noCert.Certificates = nil

	edgeAsClient := good.Clone()
	pair, err := tls.X509KeyPair(edgePEM, edgeKey)
	if err != nil {
		t.Fatal(err)
	}
	edgeAsClient.Certificates = []tls.Certificate{pair}

	// A ClientAuth certificate from the right CA without the server role passes the
	// handshake; RequireServer must refuse it.
	roleless := good.Clone()
	rlCert, rlKey := craft(t, ca, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "edge1", OrganizationalUnit: []string{RoleEdge}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if pair, err = tls.X509KeyPair(rlCert, rlKey); err != nil {
		t.Fatal(err)
	}
	roleless.Certificates = []tls.Certificate{pair}

	other, otherPEM := newCA(t, "other")
	// Trusts both CAs, so only the edge's verdict on its other-CA certificate counts.
	otherClient := serverCfg(other, append(bytes.Clone(otherPEM), caPEM...))
	// A client picks no certificate the edge's CA list does not name, so force it to offer one.
	forcedOther := otherClient.Clone()
	forcedOther.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return &otherClient.Certificates[0], nil
	}
	// Trusts only the other CA, so the edge's certificate is not.
	distrusting := good.Clone()
	distrusting.RootCAs = x509.NewCertPool()
	distrusting.RootCAs.AddCert(other.cert)

	past := *ca
	past.now = func() time.Time { return time.Now().Add(-3 * time.Hour) }
	expired := serverCfg(&past, caPEM)

	for _, tc := range []struct {
		name    string
		cfg     *tls.Config
		node    string
		path    string
		want    int    // status; 0 means the call must fail
		wantErr string // substring of the call's error
	}{
		{"server cert", good, "edge1", "/v1/sandboxes", 200, ""},
		{"server cert, probe", good, "edge1", "/healthz", 200, ""},
		{"no client cert", noCert, "edge1", "/v1/sandboxes", 401, ""},
		{"no client cert, probe", noCert, "edge1", "/healthz", 200, ""},
		{"no client cert, probe path variant", noCert, "edge1", "/healthz/", 401, ""},
		{"edge cert as client", edgeAsClient, "edge1", "/v1/sandboxes", 401, ""},
		{"client cert without server role", roleless, "edge1", "/v1/sandboxes", 401, ""},
		{"client cert of another CA, not offered", otherClient, "edge1", "/v1/sandboxes", 401, ""},
		{"client cert of another CA, offered", forcedOther, "edge1", "/v1/sandboxes", 0, "certificate"},
		{"edge cert of another CA", distrusting, "edge1", "/healthz", 0, "certificate signed by unknown authority"},
		{"edge1 dialled as edge2", good, "edge2", "/healthz", 0, "edge2"},
		{"expired client cert", expired, "edge1", "/v1/sandboxes", 0, "certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body, err := get(ForNode(tc.cfg, tc.node), hs.URL+tc.path)
			if tc.want == 0 {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got status %d, error %v; want an error containing %q", status, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("got error %v, want status %d", err, tc.want)
			}
			if status != tc.want {
				t.Fatalf("got status %d (%s), want %d", status, body, tc.want)
			}
			if status == 401 {
				var e model.Error
				if err := json.Unmarshal(body, &e); err != nil || e.Code != "unauthorized" || e.Message == "" {
					t.Errorf("401 body %s: want a JSON error with code unauthorized and a message (%v)", body, err)
				}
			}
		})
	}
}

// nodeChannel serves the node channel the way a replica does (NodeChannelTLS, RequireEdge), and
// answers with the node RequireEdge found.
func nodeChannel(t *testing.T, ca *CA, caPEM []byte) *httptest.Server {
	t.Helper()
	certPEM, keyPEM, err := ca.IssueServer("replica-a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := NodeChannelTLS(caPEM, certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(RequireEdge(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, EdgeNode(r))
	})))
	hs.TLS = cfg
	hs.Config.ErrorLog = log.New(testLog{t}, "node channel: ", 0)
	hs.StartTLS()
	t.Cleanup(hs.Close)
	return hs
}

func TestNodeChannel(t *testing.T) {
	ca, caPEM := newCA(t, "ca")
	hs := nodeChannel(t, ca, caPEM)
	edgeCfg := func(certPEM, keyPEM []byte) *tls.Config {
		t.Helper()
		cfg, err := EdgeClientTLS(caPEM, certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	good := edgeCfg(edgeCert(t, ca, "edge1", time.Hour))

	// A replica's certificate offered as a client: verified, but not an edge's.
	srvPEM, srvKey, err := ca.IssueServer("replica-b", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	replica := good.Clone()
	pair, err := tls.X509KeyPair(srvPEM, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	replica.Certificates = []tls.Certificate{pair}

	// An edge's certificate from before the node channel (ServerAuth only) is no client one.
	oldPEM, oldKey := craft(t, ca, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "edge1", OrganizationalUnit: []string{RoleEdge}},
		DNSNames:    []string{"edge1"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if _, err := EdgeClientTLS(caPEM, oldPEM, oldKey); err == nil || !strings.Contains(err.Error(), "role") {
		t.Errorf("EdgeClientTLS took a ServerAuth-only edge certificate: %v", err)
	}
	old := good.Clone()
	if pair, err = tls.X509KeyPair(oldPEM, oldKey); err != nil {
		t.Fatal(err)
	}
	old.Certificates = []tls.Certificate{pair}

	noCert := good.Clone()
	noCert.Certificates = nil

	// A ClientAuth certificate with the edge role and a name no node may have.
	badName := good.Clone()
	bnPEM, bnKey := craft(t, ca, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "Not_A_Node", OrganizationalUnit: []string{RoleEdge}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if pair, err = tls.X509KeyPair(bnPEM, bnKey); err != nil {
		t.Fatal(err)
	}
	badName.Certificates = []tls.Certificate{pair}

	other, _ := newCA(t, "other")
	otherEdge := good.Clone()
	oPEM, oKey := edgeCert(t, other, "edge1", time.Hour)
	if pair, err = tls.X509KeyPair(oPEM, oKey); err != nil {
		t.Fatal(err)
	}
	otherEdge.Certificates = []tls.Certificate{pair}
	otherEdge.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }

	for _, tc := range []struct {
		name    string
		cfg     *tls.Config
		want    int
		wantErr string
	}{
		{"edge", good, 200, ""},
		{"replica as client", replica, 401, ""},
		{"edge cert from before the node channel", old, 0, "certificate"},
		{"no client cert", noCert, 0, "certificate"},
		{"bad node name", badName, 401, ""},
		{"edge of another CA", otherEdge, 0, "certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body, err := get(tc.cfg, hs.URL+"/node/v1/heartbeat")
			if tc.want == 0 {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got status %d (%s), error %v; want an error containing %q", status, body, err, tc.wantErr)
				}
				return
			}
			if err != nil || status != tc.want {
				t.Fatalf("got status %d (%s), error %v; want %d", status, body, err, tc.want)
			}
			if status == 200 && string(body) != "edge1" {
				t.Errorf("EdgeNode = %q, want edge1 (from the certificate)", body)
			}
		})
	}

	// The edge refuses a node channel served with an edge's certificate (a stolen edge posing
	// as the servers to its peers), though the CA signed it and it may serve.
	impostor := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	ePEM, eKey := edgeCert(t, ca, ServersName+"x", time.Hour)
	if pair, err = tls.X509KeyPair(ePEM, eKey); err != nil {
		t.Fatal(err)
	}
	impostor.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	impostor.Config.ErrorLog = log.New(testLog{t}, "impostor: ", 0)
	impostor.StartTLS()
	defer impostor.Close()
	if status, _, err := get(good, impostor.URL+"/"); err == nil {
		t.Errorf("an edge's certificate served the node channel: status %d", status)
	}
	// And one crafted to name the servers but without the server role.
	craftedPEM, craftedKey := craft(t, ca, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "x", OrganizationalUnit: []string{RoleEdge}},
		DNSNames:    []string{ServersName},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if pair, err = tls.X509KeyPair(craftedPEM, craftedKey); err != nil {
		t.Fatal(err)
	}
	impostor2 := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	impostor2.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	impostor2.Config.ErrorLog = log.New(testLog{t}, "impostor: ", 0)
	impostor2.StartTLS()
	defer impostor2.Close()
	if _, _, err := get(good, impostor2.URL+"/"); err == nil || !strings.Contains(err.Error(), "server role") {
		t.Errorf("a certificate naming the servers without their role: %v, want refused for the role", err)
	}
}

func TestRequireEdgeWithoutTLS(t *testing.T) {
	rec := httptest.NewRecorder()
	RequireEdge(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("served") })).
		ServeHTTP(rec, httptest.NewRequest("POST", "/node/v1/heartbeat", nil))
	if rec.Code != 401 {
		t.Errorf("status %d, want 401", rec.Code)
	}
}

func TestServerRefusesEdgeWithoutRole(t *testing.T) {
	ca, caPEM := newCA(t, "ca")
	// Names edge1 and may serve, but was not issued as an edge.
	certPEM, keyPEM := craft(t, ca, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "edge1"},
		DNSNames:    []string{"edge1"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	hs.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	hs.Config.ErrorLog = log.New(testLog{t}, "edge: ", 0)
	hs.StartTLS()
	defer hs.Close()

	srvPEM, srvKey, err := ca.IssueServer("r1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ServerTLS(caPEM, srvPEM, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := get(ForNode(cfg, "edge1"), hs.URL); err == nil || !strings.Contains(err.Error(), "lacks the edge role") {
		t.Errorf("got error %v, want the edge role refused", err)
	}
}

func TestServerRefusesExpiredEdge(t *testing.T) {
	ca, caPEM := newCA(t, "ca")
	past := *ca
	past.now = func() time.Time { return time.Now().Add(-3 * time.Hour) }
	edgePEM, edgeKey := edgeCert(t, &past, "edge1", time.Hour)
	hs := edgeServer(t, caPEM, edgePEM, edgeKey)
	srvPEM, srvKey, err := ca.IssueServer("r1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ServerTLS(caPEM, srvPEM, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := get(ForNode(cfg, "edge1"), hs.URL+"/healthz"); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("got error %v, want the expired edge certificate refused", err)
	}
}

func TestRequireServerWithoutTLS(t *testing.T) {
	h := RequireServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), "/healthz")
	for path, want := range map[string]int{"/v1/sandboxes": 401, "/healthz": 200} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != want {
			t.Errorf("%s without TLS: status %d, want %d", path, rec.Code, want)
		}
	}
}

// newToken returns a join token shaped like Corral's.
func newToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return "crl_" + base64.RawURLEncoding.EncodeToString(b)
}

func TestProof(t *testing.T) {
	token := newToken()
	body := []byte(`{"node":"edge1","csr":"..."}`)
	now := time.Unix(1_700_000_000, 0)
	proof, err := Proof(token, body, now)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(proof, "t=1700000000,mac=") {
		t.Errorf("proof %q: want t=1700000000,mac=...", proof)
	}
	if strings.Contains(proof, token) || strings.Contains(proof, strings.TrimPrefix(token, "crl_")) {
		t.Fatal("the proof contains the token")
	}
	for _, dt := range []time.Duration{0, 4 * time.Minute, -4 * time.Minute} {
		if err := VerifyProof(token, body, proof, now.Add(dt), 5*time.Minute); err != nil {
			t.Errorf("VerifyProof %s later: %v", dt, err)
		}
	}
	if err := VerifyProof(token, body, proof, now.Add(4*time.Minute), 0); err != nil {
		t.Errorf("VerifyProof with the default skew: %v", err)
	}

	_, mac, _ := strings.Cut(proof, ",mac=")
	// Another character of the base64url alphabet (a flipped bit could leave the alphabet,
	// which is "malformed", not "does not match").
	flipped := []byte(mac)
	flipped[0] = 'A'
	if mac[0] == 'A' {
		flipped[0] = 'B'
	}
	for _, tc := range []struct {
		name   string
		token  string
		body   []byte
		header string
		at     time.Time
		kind   error
		want   string
	}{
		{"wrong token", newToken(), body, proof, now, errdefs.ErrUnauthorized, "not this cluster's"},
		{"tampered body", token, []byte(`{"node":"edge2","csr":"..."}`), proof, now, errdefs.ErrUnauthorized, "does not match"},
		{"empty body", token, nil, proof, now, errdefs.ErrUnauthorized, "does not match"},
		{"tampered mac", token, body, "t=1700000000,mac=" + string(flipped), now, errdefs.ErrUnauthorized, "does not match"},
		{"other time", token, body, strings.Replace(proof, "t=1700000000", "t=1700000001", 1), now, errdefs.ErrUnauthorized, "does not match"},
		{"stale", token, body, proof, now.Add(12 * time.Minute), errdefs.ErrUnauthorized, "join proof is 12m old (allowed skew 5m): check the clocks of edge and server"},
		{"future", token, body, proof, now.Add(-90 * time.Minute), errdefs.ErrUnauthorized, "dated 1h30m ahead (allowed skew 5m)"},
		{"missing", token, body, "", now, errdefs.ErrUnauthorized, "no Corral-Join-Proof header"},
		{"garbage", token, body, "garbage", now, errdefs.ErrInvalid, "malformed"},
		{"fields swapped", token, body, "mac=" + mac + ",t=1700000000", now, errdefs.ErrInvalid, "malformed"},
		{"signed time", token, body, "t=+1700000000,mac=" + mac, now, errdefs.ErrInvalid, "decimal"},
		{"negative time", token, body, "t=-1,mac=" + mac, now, errdefs.ErrInvalid, "decimal"},
		{"huge time", token, body, "t=99999999999999999999,mac=" + mac, now, errdefs.ErrInvalid, "out of range"},
		{"short mac", token, body, "t=1700000000,mac=" + mac[:20], now, errdefs.ErrInvalid, "32 bytes"},
		{"padded mac", token, body, "t=1700000000,mac=" + mac + "=", now, errdefs.ErrInvalid, "32 bytes"},
		{"spaces", token, body, "t=1700000000, mac=" + mac, now, errdefs.ErrInvalid, "malformed"},
		{"oversized", token, body, proof + strings.Repeat("A", 200), now, errdefs.ErrInvalid, "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := VerifyProof(tc.token, tc.body, tc.header, tc.at, 5*time.Minute)
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want a %v error containing %q", err, tc.kind, tc.want)
			}
		})
	}

	if _, err := Proof("crl_short", body, now); err == nil {
		t.Error("Proof with a short token: no error")
	}
	if err := VerifyProof("", body, proof, now, time.Minute); err == nil {
		t.Error("VerifyProof with no server token: no error")
	}
}

func TestSealOpen(t *testing.T) {
	token := newToken()
	proof, err := Proof(token, []byte("request"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte(`{"store":"postgres://corral:hunter2@db/corral"}`)
	sealed, err := Seal(token, proof, secret)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte("hunter2")) {
		t.Fatal("the sealed response shows the plaintext")
	}
	got, err := Open(token, proof, sealed)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, secret) {
		t.Errorf("Open = %q, want %q", got, secret)
	}
	if again, _ := Seal(token, proof, secret); bytes.Equal(again, sealed) {
		t.Error("two seals of one plaintext are equal; the nonce must be random")
	}
	if empty, err := Seal(token, proof, nil); err != nil {
		t.Error(err)
	} else if got, err := Open(token, proof, empty); err != nil || len(got) != 0 {
		t.Errorf("Open of an empty seal = %q, %v", got, err)
	}

	otherProof, err := Proof(token, []byte("another request"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	flip := func(i int) []byte { b := bytes.Clone(sealed); b[i] ^= 1; return b }
	for _, tc := range []struct {
		name, token, proof string
		sealed             []byte
	}{
		{"wrong token", newToken(), proof, sealed},
		{"wrong proof", token, otherProof, sealed},
		{"nonce tampered", token, proof, flip(0)},
		{"ciphertext tampered", token, proof, flip(20)},
		{"tag tampered", token, proof, flip(len(sealed) - 1)},
		{"truncated", token, proof, sealed[:len(sealed)-1]},
		{"too short", token, proof, sealed[:10]},
		{"empty", token, proof, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Open(tc.token, tc.proof, tc.sealed)
			if !errors.Is(err, errdefs.ErrUnauthorized) {
				t.Errorf("Open = %q, %v; want an unauthorized error", got, err)
			}
		})
	}
	if _, err := Seal(token, "", secret); err == nil {
		t.Error("Seal without a proof: no error")
	}
	if _, err := Seal("short", proof, secret); err == nil {
		t.Error("Seal with a short token: no error")
	}
}

func TestHuman(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                "0s",
		40 * time.Second:                 "40s",
		12*time.Minute + 20*time.Second:  "12m",
		time.Hour:                        "1h",
		time.Hour + 5*time.Minute:        "1h5m",
		26*time.Hour + 40*time.Second:    "26h1m",
		1500 * time.Millisecond:          "2s",
		59*time.Minute + 59*time.Second:  "1h",
		5*time.Minute + 29*time.Second:   "5m",
		5*time.Minute + 30*time.Second:   "6m",
		100*time.Minute + 10*time.Second: "1h40m",
	} {
		if got := human(d); got != want {
			t.Errorf("human(%s) = %q, want %q", d, got, want)
		}
	}
}

// FuzzVerifyProof feeds VerifyProof untrusted headers: it must not panic, and must accept no
// header but the real proof.
func FuzzVerifyProof(f *testing.F) {
	token := newToken()
	body := []byte("body")
	now := time.Unix(1_700_000_000, 0)
	proof, err := Proof(token, body, now)
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{proof, "", "t=1,mac=", "t=,mac=x", "garbage", "t=1700000000,mac=" + strings.Repeat("A", 43)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, header string) {
		if err := VerifyProof(token, body, header, now, time.Minute); err == nil && header != proof {
			t.Errorf("accepted %q", header)
		}
	})
}

// FuzzOpen feeds Open untrusted bytes: it must not panic, and must open nothing but the real seal.
func FuzzOpen(f *testing.F) {
	token := newToken()
	proof := "t=1,mac=x"
	sealed, err := Seal(token, proof, []byte("secret"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(sealed)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := Open(token, proof, b); err == nil && !bytes.Equal(b, sealed) {
			t.Errorf("opened %x", b)
		}
	})
}

// FuzzSignEdge feeds SignEdge untrusted requests: it must not panic, and what it signs must name
// the node it was told and carry the edge role.
func FuzzSignEdge(f *testing.F) {
	certPEM, keyPEM, err := NewCA("ca", time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	ca, err := LoadCA(certPEM, keyPEM)
	if err != nil {
		f.Fatal(err)
	}
	_, csrPEM, err := NewCSR("edge2")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(csrPEM)
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"))
	f.Fuzz(func(t *testing.T, csr []byte) {
		out, err := ca.SignEdge(csr, "edge1", time.Hour)
		if err != nil {
			return
		}
		cert, err := parseCert(out)
		if err != nil {
			t.Fatal(err)
		}
		if cert.Subject.CommonName != "edge1" || !hasRole(cert, RoleEdge, x509.ExtKeyUsageServerAuth) {
			t.Errorf("signed %q with OU %q", cert.Subject.CommonName, cert.Subject.OrganizationalUnit)
		}
	})
}
