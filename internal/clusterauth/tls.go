package clusterauth

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	corral "github.com/corral-dev/corral/sdk/go"
)

// EdgeTLS returns the configuration an edge serves its API with: TLS 1.3, its certificate
// (certPEM, keyPEM from SignEdge and NewCSR), and client certificates verified against the
// cluster CA (caPEM, one or more certificates) when a client presents one. A handshake without
// one succeeds, so that exempt paths such as probes work; RequireServer refuses the rest.
//
// It fails when the certificate is not an edge's, or was not issued by one of the CAs of caPEM,
// so a mismatched file is noticed at start and not at the first request. Expiry is not checked
// here: see Expiry.
func EdgeTLS(caPEM, certPEM, keyPEM []byte) (*tls.Config, error) {
	cas, pool, err := caPool(caPEM)
	if err != nil {
		return nil, fmt.Errorf("edge TLS: %w", err)
	}
	cert, err := keyPair(certPEM, keyPEM, cas, RoleEdge, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return nil, fmt.Errorf("edge TLS: %w", err)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    pool,
	}, nil
}

// ServerTLS returns the configuration a server replica calls edges with: TLS 1.3, its client
// certificate (certPEM, keyPEM from IssueServer), and edges verified against the cluster CA
// (caPEM). An edge must present a certificate with the edge role. The configuration has no
// ServerName: use ForNode for each edge, so the edge's certificate must name the node dialled.
//
// It fails when the certificate is not a server's, or was not issued by one of the CAs of
// caPEM. Expiry is not checked here: see Expiry.
func ServerTLS(caPEM, certPEM, keyPEM []byte) (*tls.Config, error) {
	cas, pool, err := caPool(caPEM)
	if err != nil {
		return nil, fmt.Errorf("server TLS: %w", err)
	}
	cert, err := keyPair(certPEM, keyPEM, cas, RoleServer, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return nil, fmt.Errorf("server TLS: %w", err)
	}
	return &tls.Config{
		MinVersion:       tls.VersionTLS13,
		Certificates:     []tls.Certificate{cert},
		RootCAs:          pool,
		VerifyConnection: verifyEdge,
	}, nil
}

// ForNode returns a copy of base (from ServerTLS) for dialling the edge of node: the edge's
// certificate must name node, whatever address it is reached at.
func ForNode(base *tls.Config, node string) *tls.Config {
	c := base.Clone()
	c.ServerName = node
	return c
}

// verifyEdge refuses an edge whose verified certificate lacks the edge role. The CA issues
// ServerAuth certificates to edges only, so this is a second lock, not the first.
func verifyEdge(cs tls.ConnectionState) error {
	if len(cs.VerifiedChains) == 0 {
		return fmt.Errorf("edge %s presented no certificate verified by the cluster CA", cs.ServerName)
	}
	if leaf := cs.VerifiedChains[0][0]; !hasRole(leaf, RoleEdge, x509.ExtKeyUsageServerAuth) {
		return fmt.Errorf("edge %s presented certificate %q, which lacks the edge role", cs.ServerName, leaf.Subject.CommonName)
	}
	return nil
}

// RequireServer serves next only to corral servers of the cluster: a request must have come
// over TLS with a client certificate verified by the cluster CA (EdgeTLS) that carries the
// server role and ClientAuth usage. Others are answered 401 with a JSON error {code, message}.
// Requests for the exempt paths (compared exactly with the URL path, e.g. "/healthz") pass
// without a certificate.
func RequireServer(next http.Handler, exempt ...string) http.Handler {
	open := make(map[string]bool, len(exempt))
	for _, p := range exempt {
		open[p] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !open[r.URL.Path] {
			if err := checkServerPeer(r.TLS); err != nil {
				httpjson.Write(w, http.StatusUnauthorized, corral.Error{Code: errdefs.Code(err), Message: err.Error()})
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// checkServerPeer says why a connection is not from a corral server of the cluster, or nil.
func checkServerPeer(cs *tls.ConnectionState) error {
	switch {
	case cs == nil:
		return fmt.Errorf("the edge API is served to corral servers over mutual TLS only, and this request came without TLS: %w", errdefs.ErrUnauthorized)
	case len(cs.PeerCertificates) == 0:
		return fmt.Errorf("no client certificate: the edge API is served to corral servers of this cluster only: %w", errdefs.ErrUnauthorized)
	case len(cs.VerifiedChains) == 0:
		return fmt.Errorf("client certificate %q was not verified by the cluster CA: %w", cs.PeerCertificates[0].Subject.CommonName, errdefs.ErrUnauthorized)
	}
	if leaf := cs.VerifiedChains[0][0]; !hasRole(leaf, RoleServer, x509.ExtKeyUsageClientAuth) {
		return fmt.Errorf("client certificate %q lacks the corral server role; the edge API is served to corral servers only: %w", leaf.Subject.CommonName, errdefs.ErrUnauthorized)
	}
	return nil
}

// hasRole reports whether cert carries role, and no other, and the extended key usage.
func hasRole(cert *x509.Certificate, role string, usage x509.ExtKeyUsage) bool {
	ou := cert.Subject.OrganizationalUnit
	return len(ou) == 1 && ou[0] == role && slices.Contains(cert.ExtKeyUsage, usage)
}

// Expiry returns when the (first) certificate of certPEM expires, for renewing it in time.
func Expiry(certPEM []byte) (time.Time, error) {
	cert, err := parseCert(certPEM)
	if err != nil {
		return time.Time{}, fmt.Errorf("read certificate expiry: %w", err)
	}
	return cert.NotAfter, nil
}

// caPool parses the cluster CA certificates (more than one while a CA is replaced).
func caPool(caPEM []byte) ([]*x509.Certificate, *x509.CertPool, error) {
	cas, err := parseCerts(caPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("cluster CA: %w", err)
	}
	pool := x509.NewCertPool()
	for _, ca := range cas {
		if !ca.IsCA {
			return nil, nil, fmt.Errorf("cluster CA: certificate %q is not a certificate authority", ca.Subject.CommonName)
		}
		pool.AddCert(ca)
	}
	return cas, pool, nil
}

// keyPair loads a certificate and its key and checks that one of cas issued it for role.
func keyPair(certPEM, keyPEM []byte, cas []*x509.Certificate, role string, usage x509.ExtKeyUsage) (tls.Certificate, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("load %s certificate: %w", role, err)
	}
	leaf := cert.Leaf
	if !hasRole(leaf, role, usage) {
		return tls.Certificate{}, fmt.Errorf("certificate %q does not carry the %s role", leaf.Subject.CommonName, role)
	}
	for _, ca := range cas {
		if leaf.CheckSignatureFrom(ca) == nil {
			return cert, nil
		}
	}
	return tls.Certificate{}, fmt.Errorf("certificate %q was not issued by the cluster CA: issue a new one (an edge rejoins)", leaf.Subject.CommonName)
}
