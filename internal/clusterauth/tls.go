package clusterauth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/model"
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
	cert, pool, err := load("edge TLS", caPEM, certPEM, keyPEM, RoleEdge, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return nil, err
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
	cert, pool, err := load("server TLS", caPEM, certPEM, keyPEM, RoleServer, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return nil, err
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

// verifyEdge refuses an edge whose verified certificate lacks the edge role: a replica's
// certificate is a ServerAuth one too, but it names ServersName, never a node.
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
				httpjson.Write(w, http.StatusUnauthorized, model.Error{Code: errdefs.Code(err), Message: err.Error()})
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

// NodeChannelTLS returns the configuration a server replica serves the node channel with: TLS
// 1.3, its certificate (certPEM, keyPEM from IssueServer), and a client certificate required of
// every connection and verified against the cluster CA (caPEM). Wrap the handler in RequireEdge,
// which also checks the certificate's role.
//
// It fails when the certificate is not a server's, or was not issued by one of the CAs of caPEM.
func NodeChannelTLS(caPEM, certPEM, keyPEM []byte) (*tls.Config, error) {
	cert, pool, err := load("node channel TLS", caPEM, certPEM, keyPEM, RoleServer, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
	}, nil
}

// EdgeClientTLS returns the configuration an edge calls the servers' node channel with: TLS 1.3,
// its certificate (certPEM, keyPEM from SignEdge and NewCSR), and a server verified against the
// cluster CA (caPEM) that must carry the server role and name ServersName, whatever address the
// edge dialled.
//
// It fails when the certificate is not an edge's that may be a client (one signed before the
// node channel: join again), or was not issued by one of the CAs of caPEM.
func EdgeClientTLS(caPEM, certPEM, keyPEM []byte) (*tls.Config, error) {
	cert, pool, err := load("edge client TLS", caPEM, certPEM, keyPEM, RoleEdge, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:       tls.VersionTLS13,
		Certificates:     []tls.Certificate{cert},
		RootCAs:          pool,
		ServerName:       ServersName,
		VerifyConnection: verifyServer,
	}, nil
}

// verifyServer refuses a node channel peer whose verified certificate lacks the server role.
func verifyServer(cs tls.ConnectionState) error {
	if len(cs.VerifiedChains) == 0 {
		return fmt.Errorf("the node channel's server presented no certificate verified by the cluster CA")
	}
	if leaf := cs.VerifiedChains[0][0]; !hasRole(leaf, RoleServer, x509.ExtKeyUsageServerAuth) {
		return fmt.Errorf("the node channel's server presented certificate %q, which lacks the server role", leaf.Subject.CommonName)
	}
	return nil
}

// edgeNodeKey carries the node RequireEdge found in a request's context.
type edgeNodeKey struct{}

// RequireEdge serves next only to edges of the cluster: a request must have come over TLS with
// a client certificate verified by the cluster CA (NodeChannelTLS) that carries the edge role
// and ClientAuth usage. The node its certificate names is then in the request's context
// (EdgeNode). Others are answered 401 with a JSON error {code, message}.
func RequireEdge(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		node, err := edgePeer(r.TLS)
		if err != nil {
			httpjson.Write(w, http.StatusUnauthorized, model.Error{Code: errdefs.Code(err), Message: err.Error()})
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), edgeNodeKey{}, node)))
	})
}

// EdgeNode returns the node whose edge sent r, as RequireEdge found it in the edge's
// certificate; "" outside RequireEdge.
func EdgeNode(r *http.Request) string {
	node, _ := r.Context().Value(edgeNodeKey{}).(string)
	return node
}

// edgePeer returns the node of the edge at the other end of cs, or why it is not one.
func edgePeer(cs *tls.ConnectionState) (string, error) {
	switch {
	case cs == nil:
		return "", fmt.Errorf("the node channel is served to edges over mutual TLS only, and this request came without TLS: %w", errdefs.ErrUnauthorized)
	case len(cs.VerifiedChains) == 0:
		return "", fmt.Errorf("no client certificate verified by the cluster CA: the node channel is served to the cluster's edges only: %w", errdefs.ErrUnauthorized)
	}
	leaf := cs.VerifiedChains[0][0]
	if !hasRole(leaf, RoleEdge, x509.ExtKeyUsageClientAuth) {
		return "", fmt.Errorf("client certificate %q lacks the edge role (or was signed before the node channel: the edge joins again): %w", leaf.Subject.CommonName, errdefs.ErrUnauthorized)
	}
	if err := checkNode(leaf.Subject.CommonName); err != nil {
		return "", fmt.Errorf("client certificate: %v: %w", err, errdefs.ErrUnauthorized)
	}
	return leaf.Subject.CommonName, nil
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

// load returns the certificate of certPEM and keyPEM, checked to carry role and usage and to be
// issued by one of the CAs of caPEM, and a pool of those CAs; errors start with what.
func load(what string, caPEM, certPEM, keyPEM []byte, role string, usage x509.ExtKeyUsage) (tls.Certificate, *x509.CertPool, error) {
	cas, pool, err := caPool(caPEM)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("%s: %w", what, err)
	}
	cert, err := keyPair(certPEM, keyPEM, cas, role, usage)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("%s: %w", what, err)
	}
	return cert, pool, nil
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
