// Package clusterauth authenticates the traffic between the `corral server` replicas of a cluster
// and its `corral edge` processes, both ways. It owns the cluster CA, the certificates it issues,
// the TLS configurations both sides use, and the proof and seal of the join exchange.
//
// Joining happens before an edge holds a certificate, over the server's plain-HTTP listener, so
// it rests on the join token both sides know and which never crosses the wire. The edge sends a
// [Proof] of the request (an HMAC under a key derived from the token); the server checks it with
// [VerifyProof] and answers with a body it [Seal]s under another key derived from the token,
// bound to that proof, which the edge [Open]s. Only a holder of the token can make either, so
// each side knows the other holds it, and a sealed answer cannot be replayed to another request.
//
// After the join, traffic goes both ways over mutual TLS 1.3 under the cluster CA, which the
// servers keep in the shared store. An edge's certificate ([CA.SignEdge]) names its node (CN and
// DNS SAN) and carries the edge role; a replica's ([CA.IssueServer]) carries the server role and
// names [ServersName]. Both may serve and be clients (ExtKeyUsage ServerAuth and ClientAuth);
// what each may do is its role's, checked on every connection:
//   - server → edge (the node's API): an edge serves with [EdgeTLS] and wraps its handler in
//     [RequireServer]; a server dials with [ServerTLS] and [ForNode], so the certificate of one
//     edge presented at another node's address is refused.
//   - edge → server (the node channel: registration, heartbeats, events): a server serves with
//     [NodeChannelTLS] and wraps its handler in [RequireEdge], which tells the handler the node
//     from the certificate ([EdgeNode]), never from the request; an edge dials with
//     [EdgeClientTLS], which accepts only a certificate with the server role.
//
// Roles are the Subject's OrganizationalUnit ([RoleServer], [RoleEdge]), always set by the CA
// and never taken from a request. Keys are ECDSA P-256, written as PKCS #8 PEM ("PRIVATE KEY");
// certificates and requests are PEM.
package clusterauth

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"

	"github.com/corral-dev/corral/internal/lazyregexp"
)

// The roles a certificate of the cluster CA carries, as its Subject's OrganizationalUnit.
const (
	RoleServer = "corral-server" // a server replica: may call edges
	RoleEdge   = "corral-edge"   // an edge: may serve its node's API and call the node channel, never call another edge
)

// ServersName is the DNS name every replica's certificate carries, and the name an edge checks
// on the node channel whatever address it dials: replicas come and go behind one service
// address, and the server role, not a host name, is what makes a peer one of them. No edge gets
// it: node names are checked against it (checkNode).
const ServersName = "corral-servers"

// clockSkew is how far in the past a certificate's validity starts, so that a host whose clock
// is a little behind the CA's accepts it at once.
const clockSkew = time.Minute

// CA is the cluster's certificate authority: its certificate and the key that signs with it.
// Its methods may be called concurrently.
type CA struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
	now     func() time.Time // dates certificates; time.Now except in tests
}

// NewCA creates a self-signed CA named name (its CN), valid for ttl, with an ECDSA P-256 key.
// It returns the PEM of the certificate and of the key, which the servers keep in the shared
// store; the key must stay secret to them.
func NewCA(name string, ttl time.Duration) (certPEM, keyPEM []byte, err error) {
	if name == "" {
		return nil, nil, errors.New("create cluster CA: a name is required")
	}
	if ttl <= 0 {
		return nil, nil, fmt.Errorf("create cluster CA: validity %s must be positive", ttl)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("create cluster CA: generate key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, nil, fmt.Errorf("create cluster CA: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(ttl),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true, // it signs leaves only
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("create cluster CA: sign certificate: %w", err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("create cluster CA: %w", err)
	}
	return encodeCert(der), keyPEM, nil
}

// LoadCA parses a CA made by NewCA. It fails when the certificate is not a CA's or the key is
// not the certificate's.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := parseCert(certPEM)
	if err != nil {
		return nil, fmt.Errorf("load cluster CA: %w", err)
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("load cluster CA: certificate %q is not a certificate authority", cert.Subject.CommonName)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("load cluster CA: %w", err)
	}
	if !publicKeyEqual(key.Public(), cert.PublicKey) {
		return nil, fmt.Errorf("load cluster CA: the key is not the key of certificate %q", cert.Subject.CommonName)
	}
	return &CA{cert: cert, key: key, certPEM: encodeCert(cert.Raw), now: time.Now}, nil
}

// CertPEM returns the PEM of the CA's certificate: what edges and servers trust.
func (ca *CA) CertPEM() []byte { return bytes.Clone(ca.certPEM) }

// NewCSR makes an edge's key and a certificate request for node. The key stays on the edge; the
// request goes to a server, whose CA signs it with SignEdge.
func NewCSR(node string) (keyPEM, csrPEM []byte, err error) {
	if err := checkNode(node); err != nil {
		return nil, nil, fmt.Errorf("create certificate request: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("create certificate request: generate key: %w", err)
	}
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: node}, DNSNames: []string{node}}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		return nil, nil, fmt.Errorf("create certificate request: %w", err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("create certificate request: %w", err)
	}
	return keyPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// SignEdge signs the public key of an edge's certificate request (PEM) for node, valid for ttl
// (but never past the CA's own expiry). The certificate's identity comes from node alone, which
// the caller has authenticated; whatever names or roles the request claims are ignored. The
// request must be signed by the key it carries, so an edge holds the private key it certifies.
func (ca *CA) SignEdge(csrPEM []byte, node string, ttl time.Duration) (certPEM []byte, err error) {
	if err := checkNode(node); err != nil {
		return nil, fmt.Errorf("sign edge certificate: %w", err)
	}
	csr, err := parseCSR(csrPEM)
	if err != nil {
		return nil, fmt.Errorf("sign edge certificate for %s: %w", node, err)
	}
	tmpl := &x509.Certificate{
		Subject:  pkix.Name{CommonName: node, OrganizationalUnit: []string{RoleEdge}},
		DNSNames: []string{node},
		KeyUsage: x509.KeyUsageDigitalSignature,
		// It serves the node's API to servers and is the edge's client certificate on the
		// servers' node channel.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	certPEM, err = ca.sign(tmpl, csr.PublicKey, ttl)
	if err != nil {
		return nil, fmt.Errorf("sign edge certificate for %s: %w", node, err)
	}
	return certPEM, nil
}

// IssueServer makes a key and a certificate with the server role for the replica named replica
// (its CN, for logs), valid for ttl (but never past the CA's own expiry). The replica calls edges
// with it (ClientAuth) and serves the node channel with it (ServerAuth, DNS name ServersName).
func (ca *CA) IssueServer(replica string, ttl time.Duration) (certPEM, keyPEM []byte, err error) {
	if replica == "" || len(replica) > 64 {
		return nil, nil, fmt.Errorf("issue server certificate: replica name %q must be 1-64 characters", replica)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("issue server certificate: generate key: %w", err)
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: replica, OrganizationalUnit: []string{RoleServer}},
		DNSNames:    []string{ServersName},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}
	certPEM, err = ca.sign(tmpl, &key.PublicKey, ttl)
	if err != nil {
		return nil, nil, fmt.Errorf("issue server certificate for %s: %w", replica, err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("issue server certificate for %s: %w", replica, err)
	}
	return certPEM, keyPEM, nil
}

// sign completes tmpl with a random serial and a validity of ttl from now, and signs pub into it.
func (ca *CA) sign(tmpl *x509.Certificate, pub crypto.PublicKey, ttl time.Duration) ([]byte, error) {
	if ttl <= 0 {
		return nil, fmt.Errorf("validity %s must be positive", ttl)
	}
	now := ca.now()
	if !now.Before(ca.cert.NotAfter) {
		return nil, fmt.Errorf("the cluster CA expired at %s: create a new one and rejoin the edges", ca.cert.NotAfter.Format(time.RFC3339))
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-clockSkew)
	tmpl.NotAfter = now.Add(ttl)
	if tmpl.NotAfter.After(ca.cert.NotAfter) {
		tmpl.NotAfter = ca.cert.NotAfter
	}
	tmpl.BasicConstraintsValid = true
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, pub, ca.key)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	return encodeCert(der), nil
}

// nodeRE is a node name usable as a TLS server name: one lowercase DNS label. Edge node names
// (1-32 lowercase letters, digits and inner hyphens) all match.
var nodeRE = lazyregexp.New(`^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$`)

func checkNode(node string) error {
	if !nodeRE.MatchString(node) || net.ParseIP(node) != nil {
		return fmt.Errorf("node name %q must be 1-63 lowercase letters, digits or inner hyphens", node)
	}
	if node == ServersName {
		return fmt.Errorf("node name %q is the name the servers' certificates carry", node)
	}
	return nil
}

// parseCSR decodes a certificate request and checks that it is signed by the key it carries
// and that the key is one TLS 1.3 can use.
func parseCSR(csrPEM []byte) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode(csrPEM)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New(`certificate request is not PEM of type "CERTIFICATE REQUEST"`)
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse certificate request: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("certificate request is not signed by the key it carries: %w", err)
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() && k.Curve != elliptic.P521() {
			return nil, fmt.Errorf("certificate request key uses curve %s; want P-256, P-384 or P-521", k.Curve.Params().Name)
		}
	case ed25519.PublicKey:
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return nil, fmt.Errorf("certificate request RSA key has %d bits; want at least 2048", k.N.BitLen())
		}
	default:
		return nil, fmt.Errorf("certificate request key of type %T is not supported", k)
	}
	return csr, nil
}

// newSerial returns a random positive serial of up to 128 bits.
func newSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generate serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func encodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// parseCert decodes the first certificate of certPEM.
func parseCert(certPEM []byte) (*x509.Certificate, error) {
	certs, err := parseCerts(certPEM)
	if err != nil {
		return nil, err
	}
	return certs[0], nil
}

// parseCerts decodes every certificate of certPEM, which must hold at least one; other blocks
// are an error, so a key pasted in the wrong place is noticed.
func parseCerts(certPEM []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for rest := certPEM; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("certificate PEM holds a %q block; want only CERTIFICATE", block.Type)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificate: %w", err)
		}
		certs = append(certs, cert)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM certificate found")
	}
	return certs, nil
}

func parseKey(keyPEM []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(keyPEM)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New(`key is not PEM of type "PRIVATE KEY" (PKCS #8)`)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("key of type %T cannot sign", key)
	}
	return signer, nil
}

func publicKeyEqual(a, b crypto.PublicKey) bool {
	e, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && e.Equal(b)
}
