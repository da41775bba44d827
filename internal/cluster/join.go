package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/internal/apiserver"
	"github.com/corral-dev/corral/internal/clusterauth"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/nodeproto"
	"github.com/corral-dev/corral/internal/store"
)

// Joining. An edge proves it holds the join token without sending it (clusterauth.Proof over
// the request), and the server's answer is sealed under a key derived from the token: the
// exchange is safe over the servers' plain-HTTP listener, only a holder of the token can read
// the answer (the store's DSN, the edge's certificate), and the edge knows the answer came from
// the cluster. After joining, servers reach the edge over mutual TLS under the cluster CA, and
// the edge serves nobody else.

// Settings in the shared store.
const (
	joinSetting = "cluster.join.token" // the join token itself (a proof is checked against it)
	caSetting   = "cluster.ca"         // the cluster CA: {"cert": PEM, "key": PEM}
)

// Certificate lifetimes. Each is renewed when half of it has passed (edges rejoin; servers
// reissue their own), so a process that runs for years keeps working.
const (
	caTTL     = 10 * 365 * 24 * time.Hour
	edgeTTL   = 30 * 24 * time.Hour
	serverTTL = 7 * 24 * time.Hour
)

// JoinRequest is what an edge sends to join: its node name and a certificate request for the
// key it keeps.
type JoinRequest struct {
	Node string `json:"node"`
	CSR  string `json:"csr"`
}

// JoinResponse is what a joining edge learns (sealed): where the cluster keeps its state and
// layers, the cluster CA, and the edge's certificate.
type JoinResponse struct {
	// Store is a DSN for edges of an older release, which open the store (given only with
	// corral server --edge-store, during an upgrade): this release's edges open none.
	Store     string `json:"store,omitempty"`
	BlobStore string `json:"blob_store"`
	CA        string `json:"ca"`
	Cert      string `json:"cert"`
	// NodeURLs are the servers' node channel (internal/nodeproto), where the edge registers,
	// heartbeats and sends its events: the replica joined through first, then the others alive.
	NodeURLs []string `json:"node_urls,omitempty"`
}

// caRecord is the CA as the store keeps it.
type caRecord struct {
	Cert string `json:"cert"`
	Key  string `json:"key"`
}

// loadCA returns the cluster CA, creating it when the store has none (replicas racing to create
// it agree on the first one stored).
func loadCA(ctx context.Context, st *store.Store) (*clusterauth.CA, error) {
	var rec caRecord
	err := readSetting(ctx, st, caSetting, &rec)
	if errors.Is(err, errdefs.ErrNotFound) {
		certPEM, keyPEM, nerr := clusterauth.NewCA("corral cluster CA", caTTL)
		if nerr != nil {
			return nil, nerr
		}
		doc, _ := json.Marshal(caRecord{Cert: string(certPEM), Key: string(keyPEM)})
		if _, perr := st.PutSettingIfAbsent(ctx, caSetting, doc); perr != nil {
			return nil, perr
		}
		err = readSetting(ctx, st, caSetting, &rec) // the first one stored wins
	}
	if err != nil {
		return nil, fmt.Errorf("the cluster CA: %w", err)
	}
	return clusterauth.LoadCA([]byte(rec.Cert), []byte(rec.Key))
}

// joinToken returns the cluster's join token.
func joinToken(ctx context.Context, st *store.Store) (string, error) {
	var tok string
	if err := readSetting(ctx, st, joinSetting, &tok); err != nil {
		return "", fmt.Errorf("the join token: %w", err)
	}
	return tok, nil
}

// maxJoinBody bounds a join request (a node name and a CSR).
const maxJoinBody = 64 << 10

// join answers an edge that proves it holds the join token with the cluster's store, blob
// store, CA and a certificate for its node. Repeating a join does no harm: it only signs
// another certificate for a key the sender holds.
func (s *Server) join(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJoinBody))
	if err != nil {
		httpjson.Error(w, r, s.log, errdefs.Invalid("body", "read the join request (at most 64 KiB): %v", err))
		return
	}
	tok, err := joinToken(r.Context(), s.store)
	if err != nil {
		httpjson.Error(w, r, s.log, err)
		return
	}
	proof := r.Header.Get(clusterauth.ProofHeader)
	if err := clusterauth.VerifyProof(tok, body, proof, time.Now(), 0); err != nil {
		s.log.Warn("join refused", "remote", r.RemoteAddr, "err", err)
		httpjson.Error(w, r, s.log, err)
		return
	}
	var req JoinRequest
	if err := json.Unmarshal(body, &req); err != nil {
		httpjson.Error(w, r, s.log, errdefs.Invalid("body", "not a join request: %v", err))
		return
	}
	cert, err := s.ca.SignEdge([]byte(req.CSR), req.Node, edgeTTL)
	if err != nil {
		httpjson.Error(w, r, s.log, errdefs.Invalid("csr", "%v", err))
		return
	}
	answer, _ := json.Marshal(JoinResponse{Store: s.edgeStore(), BlobStore: s.cfg.BlobStore, CA: string(s.ca.CertPEM()), Cert: string(cert),
		NodeURLs: s.nodeURLs(r)})
	sealed, err := clusterauth.Seal(tok, proof, answer)
	if err != nil {
		httpjson.Error(w, r, s.log, err)
		return
	}
	s.log.Info("edge joined", "node", req.Node, "remote", r.RemoteAddr)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Write(sealed)
}

// Joined is what an edge holds after joining: the blob store the cluster keeps its layers and
// volumes in, the servers' node channel, and the TLS configuration its API serves servers with
// (its certificate renewed by KeepFresh). No store: an edge works through the servers.
type Joined struct {
	BlobStore string
	// TLS serves the edge's API: its certificate, and client certificates checked against the
	// cluster CA (serve through clusterauth.RequireServer).
	TLS *tls.Config
	// Servers is the client of the servers' node channel, with the edge's certificate as
	// KeepFresh renews it; nil from a server of a release older than the channel, which an
	// edge cannot work with (it holds no store credentials to work without it).
	Servers *nodeproto.Servers

	server, token, node string
	cert                atomic.Pointer[tls.Certificate]
	expires             atomic.Int64 // unix seconds
}

// Join joins the cluster through server as node, with the join token in tokenFile.
func Join(ctx context.Context, server, tokenFile, node string) (*Joined, error) {
	b, err := os.ReadFile(tokenFile)
	if err != nil {
		return nil, fmt.Errorf("read the join token: %w", err)
	}
	j := &Joined{server: strings.TrimRight(server, "/"), token: strings.TrimSpace(string(b)), node: node}
	ans, err := j.join(ctx)
	if err != nil {
		return nil, err
	}
	j.BlobStore = ans.BlobStore
	return j, nil
}

// join asks for a certificate for a new key and installs it.
func (j *Joined) join(ctx context.Context) (*JoinResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	keyPEM, csrPEM, err := clusterauth.NewCSR(j.node)
	if err != nil {
		return nil, err
	}
	body, _ := json.Marshal(JoinRequest{Node: j.node, CSR: string(csrPEM)})
	proof, err := clusterauth.Proof(j.token, body, time.Now())
	if err != nil {
		return nil, fmt.Errorf("join %s: %w", j.server, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, j.server+"/v1/cluster/join", bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("join %s: %w", j.server, err)
	}
	req.Header.Set(clusterauth.ProofHeader, proof)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("join %s: %w", j.server, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("join %s: %s: %s", j.server, resp.Status, strings.TrimSpace(string(raw)))
	}
	plain, err := clusterauth.Open(j.token, proof, raw)
	if err != nil {
		return nil, fmt.Errorf("join %s: the answer is not sealed with this join token (is this the cluster's server?): %w", j.server, err)
	}
	var ans JoinResponse
	if err := json.Unmarshal(plain, &ans); err != nil || ans.CA == "" {
		return nil, fmt.Errorf("join %s: unexpected answer", j.server)
	}
	cfg, err := clusterauth.EdgeTLS([]byte(ans.CA), []byte(ans.Cert), keyPEM)
	if err != nil {
		return nil, fmt.Errorf("join %s: %w", j.server, err)
	}
	exp, err := clusterauth.Expiry([]byte(ans.Cert))
	if err != nil {
		return nil, err
	}
	j.cert.Store(&cfg.Certificates[0])
	j.expires.Store(exp.Unix())
	if j.TLS == nil {
		// The certificate is read per handshake, so a renewal needs no restart. The CA stays
		// the one of the first join (a new CA means restarting the edges).
		cfg.Certificates = nil
		cfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return j.cert.Load(), nil }
		j.TLS = cfg
		if len(ans.NodeURLs) > 0 {
			// The same certificate is the edge's client one on the node channel.
			ccfg, err := clusterauth.EdgeClientTLS([]byte(ans.CA), []byte(ans.Cert), keyPEM)
			if err != nil {
				return nil, fmt.Errorf("join %s: %w", j.server, err)
			}
			ccfg.Certificates = nil
			ccfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return j.cert.Load(), nil }
			if j.Servers, err = nodeproto.NewServers(ans.NodeURLs, ccfg); err != nil {
				return nil, fmt.Errorf("join %s: %w", j.server, err)
			}
		}
	}
	return &ans, nil
}

// KeepFresh rejoins for a new certificate when half of the current one's life has passed, until
// ctx ends; failures are retried every minute and logged.
func (j *Joined) KeepFresh(ctx context.Context, log *slog.Logger) {
	for {
		left := time.Until(time.Unix(j.expires.Load(), 0))
		wait := left - edgeTTL/2
		if wait < 0 {
			wait = 0
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		if _, err := j.join(ctx); err != nil {
			if errors.Is(ctx.Err(), context.Canceled) {
				return
			}
			log.Error("renew the edge's certificate (servers refuse it once it expires)", "err", err, "expires", time.Unix(j.expires.Load(), 0))
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Minute):
			}
			continue
		}
		log.Info("edge certificate renewed", "expires", time.Unix(j.expires.Load(), 0))
	}
}

// bootstrapTokens makes the first replica on an empty store choose the join and admin tokens:
// the ones in its data dir when they exist (a Kubernetes Secret mounted there), new ones
// otherwise, written there (mode 0600). Later replicas find the join token set and just serve.
func bootstrapTokens(ctx context.Context, cfg Config, st *store.Store, log *slog.Logger) error {
	if _, err := st.GetSetting(ctx, joinSetting); err == nil {
		return nil // bootstrapped already
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	joinPath, adminPath := cfg.DataDir+"/join.token", cfg.DataDir+"/admin.token"
	join, joinGiven, err := tokenFile(joinPath)
	if err != nil {
		return err
	}
	admin, adminGiven, err := tokenFile(adminPath)
	if err != nil {
		return err
	}
	// The admin token and the files first, the join token's setting last: a start that fails
	// in between leaves no half-bootstrapped store, and the next start finds the files and
	// finishes with the same tokens.
	if _, err := st.TokenByHash(ctx, apiserver.HashToken(admin)); errors.Is(err, errdefs.ErrNotFound) {
		if err := st.AddRootToken(ctx, apiserver.HashToken(admin)); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	for _, f := range []struct {
		path, tok string
		given     bool
	}{{joinPath, join, joinGiven}, {adminPath, admin, adminGiven}} {
		if !f.given {
			if err := os.WriteFile(f.path, []byte(f.tok+"\n"), 0o600); err != nil {
				return fmt.Errorf("write %s: %w", f.path, err)
			}
		}
	}
	doc, _ := json.Marshal(join)
	created, err := st.PutSettingIfAbsent(ctx, joinSetting, doc)
	if err != nil {
		return err
	}
	if !created {
		// Another replica bootstrapped at the same moment: its join token is the cluster's. The
		// admin token written here is a valid root token all the same.
		if !joinGiven {
			os.Remove(joinPath)
		}
		log.Info("another replica bootstrapped the cluster store at the same time; using its join token")
		return nil
	}
	log.Info("bootstrapped the cluster store", "admin_token", adminPath, "join_token", joinPath, "admin_token_given", adminGiven, "join_token_given", joinGiven)
	return nil
}

// tokenFile returns the token in path, or a new one when there is no such file.
func tokenFile(path string) (tok string, given bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		tok, _ := iam.NewToken()
		return tok, false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read %s: %w", path, err)
	}
	tok = strings.TrimSpace(string(b))
	if len(tok) < clusterauth.MinTokenLen || strings.ContainsFunc(tok, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
		return "", false, errdefs.Invalid(path, "a cluster token is at least %d printable ASCII characters without spaces (make one with: openssl rand -hex 32)", clusterauth.MinTokenLen)
	}
	return tok, true, nil
}

// edgeStore is the store DSN joining edges get: none, unless --edge-store names one for edges
// of an older release (which open the store) while a cluster upgrades.
func (s *Server) edgeStore() string { return s.cfg.EdgeStore }
