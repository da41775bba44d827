// Package cluster is `corral server`: the stateless front of a cluster of edges. Any number of
// replicas serve one PostgreSQL store; each edge (`corral edge`) runs the sandboxes of its host
// and serves them through the same API as `corral up`.
//
// A server replica does four things and keeps no state of its own:
//   - identity: it authenticates every request once and serves who the caller is, projects,
//     quotas, placement, principals, grants, tokens and the audit log itself (edges do not);
//   - placement: a create goes to a ready node chosen by power-of-k choice on the load the
//     nodes' heartbeats report plus this replica's own placements not yet reported
//     (internal/placement); a node that is unreachable or unavailable is excluded and another
//     tried;
//   - routing: a sandbox's ID names its node, so every request about it goes straight there,
//     and so does a build's; the lists, identity and the catalogue's reads and writes are the
//     replica's own; what needs a node but not a particular one (an import, a build's start)
//     goes to any ready edge, since every edge serves the one shared blob store;
//   - watching: nodes whose lease ran out past the grace period are declared lost (store:
//     SweepLostNodes), their sandboxes fail with node_lost and their quota is given back.
//
// Users' tokens are checked here, once per request: the server sends the edge the caller it
// found (internal/nodeproto), never the token, and the edge looks no token up. Edges join with
// the join token and then hold a lease in the store.
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
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/apiserver"
	"github.com/corral-dev/corral/internal/build"
	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/clusterauth"
	"github.com/corral-dev/corral/internal/console"
	"github.com/corral-dev/corral/internal/daemon"
	"github.com/corral-dev/corral/internal/edge"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/limits"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/nodeproto"
	"github.com/corral-dev/corral/internal/placement"
	"github.com/corral-dev/corral/internal/revproxy"
	"github.com/corral-dev/corral/internal/store"
	"github.com/corral-dev/corral/internal/trace"
	"github.com/corral-dev/corral/internal/webhook"
)

// Config configures `corral server`.
type Config struct {
	DataDir string // holds admin.token and join.token when this replica bootstraps the store
	Listen  string
	// NodeListen is the node channel's address: edges register, heartbeat and send their events
	// there, over mutual TLS (default: Listen's host, the port after Listen's).
	NodeListen string
	// NodeURL is how edges reach the node channel, https://HOST:PORT, one address for every
	// replica (default: the host a joining edge reached this replica at, NodeListen's port).
	NodeURL string
	Store   string // postgres://...
	// EdgeStore is a DSN handed to joining edges of an older release, which open the store,
	// while a cluster upgrades: a role with an edge's privileges only (store.EdgeRoleSQL;
	// `corral server edge-role`). Default none: this release's edges open no store.
	EdgeStore string
	BlobStore string // handed to joining edges
	// LeaseGrace is how long past its lease a node is declared lost (default 10s).
	LeaseGrace time.Duration
	// K is placement's sample size (default 2; 1 random; -1 least loaded of all).
	K int
	// MaxTries bounds the nodes one create is tried on (default 3).
	MaxTries int
	// Overcommit is how far placement grants each resource beyond a node's capacity (defaults:
	// CPU 4, memory 1, disk 1; sandbox writable disks are sparse, so disk can often go higher).
	Overcommit placement.Overcommit
	// E2B serves E2B's API beside Corral's on every replica (off unless E2B.Listen is set).
	E2B daemon.E2BConfig
	// OTLPEndpoint is the OTLP/HTTP receiver traces go to (trace.Config.Endpoint); empty:
	// $OTEL_EXPORTER_OTLP_ENDPOINT, else no tracing.
	OTLPEndpoint string
	// AuditRetention is how long audit entries are kept (default 90 days).
	AuditRetention time.Duration
	// SandboxRetention is how long records of ended sandboxes, every node's, are kept
	// (default 24h).
	SandboxRetention time.Duration
	// Webhooks tunes the webhook dispatcher, which one replica at a time runs.
	Webhooks webhook.Config
}

func (c *Config) setDefaults() {
	if c.AuditRetention == 0 {
		c.AuditRetention = 90 * 24 * time.Hour
	}
	if c.SandboxRetention == 0 {
		c.SandboxRetention = 24 * time.Hour
	}
	if c.LeaseGrace == 0 {
		c.LeaseGrace = 10 * time.Second
	}
	if c.MaxTries == 0 {
		c.MaxTries = 3
	}
	if c.NodeListen == "" {
		if host, port, err := net.SplitHostPort(c.Listen); err == nil {
			switch p, err := strconv.Atoi(port); {
			case err == nil && p == 0:
				c.NodeListen = net.JoinHostPort(host, "0") // any free port, as for the API
			case err == nil && p > 0 && p < 65535:
				c.NodeListen = net.JoinHostPort(host, strconv.Itoa(p+1))
			}
		}
	}
}

// clusterLimits is the limits policy the servers resolve a create's limits with before placing
// it. Its disk ceiling is the policy's outermost: --max-sandbox-disk is each node's own, and the
// node the create lands on checks it.
var clusterLimits = func() *limits.Policy {
	p, err := limits.New(limits.Config{MaxDiskBytes: limits.DiskCeiling})
	if err != nil {
		panic(err)
	}
	return p
}()

// Server is one replica.
type Server struct {
	cfg    Config
	log    *slog.Logger
	store  *store.Store
	api    *apiserver.Server // authentication for the server's own routes
	placer *placement.Placer
	ca     *clusterauth.CA
	tls    *tls.Config // calls to edges: this replica's client certificate, the CA (per node: ForNode)
	// nodeTLS serves the node channel: this replica's certificate, edges' certificates required.
	nodeTLS *tls.Config
	name    string // this replica, in its certificate
	// sealer seals the callers sent to edges and opens those their admissions hand back
	// (nodeproto.Sealer), with the key the replicas share (sealKeySetting).
	sealer *nodeproto.Sealer
	// resolver resolves the edges' creates (nodeResolve). It adopts nothing from the shared
	// catalogue: a cluster's edges publish to the one store.
	resolver *catalog.Resolver

	mu     sync.Mutex
	nodes  []model.Node // the last read of the nodes table
	readAt time.Time
	conns  map[string]*edgeConn // by node name and URL
	rr     atomic.Uint64
	cert   *tls.Certificate // this replica's certificate, reissued at half its life

	nodePort   int // the node channel's port, for the node URL a joining edge gets
	replicasMu sync.Mutex
	replicas   []string  // the replicas' node channel URLs as last read; protected by replicasMu
	replicasAt time.Time // when; protected by replicasMu

	// configMu guards the configuration edges follow as last read (nodechannel.go), so that
	// heartbeats arriving together make one read.
	configMu      sync.Mutex
	config        *nodeproto.ConfigResponse // as last read; protected by configMu
	configAt      time.Time                 // when that read started; protected by configMu
	configReading bool                      // a read is under way; protected by configMu
}

// edgeConn is how this replica reaches one edge: over mutual TLS that checks the edge's
// certificate names the node.
type edgeConn struct {
	client *http.Client
	proxy  *httputil.ReverseProxy
	// upgrade proxies requests that ask for a connection upgrade (a WebSocket to a sandbox's
	// port, the console's screen, `corral vnc`) over HTTP/1.1: HTTP/2 carries no Upgrade.
	upgrade *httputil.ReverseProxy
}

// serve proxies r to the edge: over the shared HTTP/2 connection, or over a connection of its
// own when r asks for an upgrade.
func (c *edgeConn) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Upgrade") != "" {
		c.upgrade.ServeHTTP(w, r)
		return
	}
	revproxy.Serve(c.proxy, w, r)
}

// Run serves until ctx ends. ready, if not nil, receives the listen address once serving.
func Run(ctx context.Context, cfg Config, log *slog.Logger, ready chan<- string) error {
	cfg.setDefaults()
	if !store.IsPostgres(cfg.Store) {
		return errdefs.Invalid("store", "corral server needs a PostgreSQL store shared by every replica (postgres://USER@HOST:PORT/DB?sslmode=disable)")
	}
	if cfg.EdgeStore != "" && !store.IsPostgres(cfg.EdgeStore) {
		return errdefs.Invalid("edge-store", "the edges' store is the cluster's PostgreSQL, as a role of its own (postgres://corral_edge@HOST:PORT/DB?sslmode=disable)")
	}
	if cfg.NodeListen == "" {
		return errdefs.Invalid("node-listen", "the node channel needs an address (--listen %q gives none to derive it from)", cfg.Listen)
	}
	if cfg.NodeURL != "" {
		if err := checkHTTPS(cfg.NodeURL); err != nil {
			return errdefs.Invalid("node-url", "%q: edges reach the node channel at https://HOST:PORT", cfg.NodeURL)
		}
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	stopTracing, err := trace.Setup(ctx, trace.Config{Endpoint: cfg.OTLPEndpoint, Service: "corral-server"}, log)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		stopTracing(sctx)
	}()
	st, err := store.Open(ctx, cfg.Store)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := bootstrapTokens(ctx, cfg, st, log); err != nil {
		return err
	}
	ca, err := loadCA(ctx, st)
	if err != nil {
		return err
	}
	placer, err := placement.New(placement.Config{K: cfg.K, Overcommit: cfg.Overcommit})
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	sealer, err := loadSealer(ctx, st)
	if err != nil {
		return err
	}
	s := newServer(cfg, log, st, placer, ca, sealer, host+"/"+cfg.Listen)
	if s.tls, s.nodeTLS, err = s.tlsConfigs(); err != nil {
		return err
	}
	// Quota usage counters are rebuilt from the sandbox rows at every start of a replica (edges
	// no longer do it): whatever happened before, admission starts from the truth.
	if err := st.RecountUsage(ctx); err != nil {
		return err
	}
	hooks := webhook.New(cfg.Webhooks, log.With("component", "webhooks"), st, nil)
	s.api.SetWebhooks(hooks)
	go s.dispatchWebhooks(ctx, hooks)
	go s.api.Prune(ctx, cfg.AuditRetention)
	go s.forgetEnded(ctx)
	go s.watch(ctx)
	nodeLis, err := net.Listen("tcp", cfg.NodeListen)
	if err != nil {
		return fmt.Errorf("listen on %s for the node channel (--node-listen): %w", cfg.NodeListen, err)
	}
	s.nodePort = nodeLis.Addr().(*net.TCPAddr).Port
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		nodeLis.Close()
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	errc := make(chan error, 3)
	go func() { errc <- srv.Serve(lis) }()
	nodeSrv := s.serveNodes(nodeLis, errc)
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		nodeSrv.Shutdown(sctx) // calls in flight finish; the edges' next ones go to another replica
	}()
	announceCtx, stopAnnounce := context.WithCancel(ctx)
	announced := make(chan struct{})
	go func() { defer close(announced); s.announce(announceCtx) }()
	defer func() { stopAnnounce(); <-announced }()
	if cfg.E2B.Listen != "" {
		key, service, err := e2bSecrets(ctx, st, log)
		if err != nil {
			srv.Close()
			return err
		}
		stopE2B, err := daemon.ServeE2B(cfg.E2B, lis.Addr(), srv.Handler, key, service, log, errc)
		if err != nil {
			srv.Close()
			return err
		}
		defer stopE2B()
	}
	log.Info("corral server is up", "listen", lis.Addr().String(), "node_listen", nodeLis.Addr().String(), "node_url", cfg.NodeURL, "k", cfg.K, "lease_grace", cfg.LeaseGrace)
	if ready != nil {
		ready <- lis.Addr().String()
	}
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	return nil
}

// sealKeySetting keeps the key the replicas seal callers for edges with: the edges' store role
// cannot read the settings.
const sealKeySetting = "cluster.seal-key"

// loadSealer returns the Sealer of the replicas' shared key, made by the first replica.
func loadSealer(ctx context.Context, st *store.Store) (*nodeproto.Sealer, error) {
	key, err := sharedKey(ctx, st, sealKeySetting)
	if err != nil {
		return nil, fmt.Errorf("the replicas' seal key: %w", err)
	}
	return nodeproto.NewSealer(key)
}

// newServer is a replica named name, its API wired to reach the nodes (fleet) and to keep the
// volumes (volumes), before its TLS configurations are made.
func newServer(cfg Config, log *slog.Logger, st *store.Store, placer *placement.Placer, ca *clusterauth.CA, sealer *nodeproto.Sealer, name string) *Server {
	s := &Server{
		cfg: cfg, log: log, store: st, placer: placer, ca: ca, sealer: sealer,
		resolver: &catalog.Resolver{Store: st, Log: log},
		api:      apiserver.New(log, st, nil, nil, apiserver.Info{}),
		conns:    map[string]*edgeConn{},
		name:     name,
	}
	s.api.SetFleet(fleet{s})
	s.api.SetVolumes(volumes{s})
	s.api.SetEnvironments(environments{s})
	return s
}

// Handler returns the replica's HTTP handler.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("POST /v1/cluster/join", s.join)
	mux.Handle("/ui/", console.Handler())
	mux.Handle("/ui", console.Handler())
	nodes := http.NewServeMux()
	nodes.HandleFunc("GET /v1/nodes", func(w http.ResponseWriter, r *http.Request) {
		if err := apiserver.Require(r, iam.Operator, ""); err != nil {
			httpjson.Error(w, r, s.log, err)
			return
		}
		list, err := s.store.ListNodes(r.Context())
		if err != nil {
			httpjson.Error(w, r, s.log, err)
			return
		}
		httpjson.Write(w, http.StatusOK, list)
	})
	nodes.HandleFunc("POST /v1/nodes/{name}/{action}", s.nodeAction)
	mux.Handle("/v1/nodes", s.api.Authenticated(nodes))
	mux.Handle("/v1/nodes/", s.api.Authenticated(nodes))
	// Identity, projects, quotas, placement, the audit log, events, the usage report and
	// webhooks are this replica's own: no edge serves them (a forced project delete reaches the
	// nodes through fleet).
	own := s.api.ServerHandler()
	for _, p := range apiserver.ServerPaths {
		mux.Handle(p, own)
	}
	mux.Handle("GET /v1/metrics", s.api.Authenticated(http.HandlerFunc(s.metrics)))
	mux.Handle("POST /v1/sandboxes", s.api.Authenticated(http.HandlerFunc(s.create)))
	mux.Handle("GET /v1/layers/{name}/{version}/stats", s.forward(s.toNamedNode))
	mux.Handle("GET /v1/builds", s.forward(http.HandlerFunc(s.listBuilds)))
	mux.Handle("POST /v1/builds", s.forward(http.HandlerFunc(s.startBuild)))
	mux.Handle("/v1/builds/{id}", s.forward(s.toBuildNode))
	mux.Handle("/v1/builds/{id}/", s.forward(s.toBuildNode))
	mux.Handle("/v1/sandboxes/{id}", s.forward(s.toOwner))
	mux.Handle("/v1/sandboxes/{id}/", s.forward(s.toOwner))
	mux.Handle("/", s.forward(s.toAny))
	return trace.Extract(stripNodeHeaders(mux))
}

// forward authenticates a request bound for an edge; the edge it goes to gets the caller the
// way it speaks (asCaller), once the node is chosen.
func (s *Server) forward(next http.HandlerFunc) http.Handler {
	return s.api.Authenticated(next)
}

// asCaller makes h, the header of the authenticated request r on its way to node n's edge,
// carry r's caller as n speaks: from node protocol 1 on, the caller and no token
// (apiserver.ForwardCaller); to an edge older than the protocol, registered without a version
// (a rolling upgrade, servers first), the user's token as before, which that edge checks.
func (s *Server) asCaller(r *http.Request, n model.Node, h http.Header) error {
	if n.Protocol >= nodeproto.Version {
		return apiserver.ForwardCaller(r, h, n.Name, s.sealer)
	}
	if a := r.Header.Get("Authorization"); a != "" {
		h.Set("Authorization", a)
	}
	return nil
}

// resolve resolves a create (req, its project filled in) for the edge it is forwarded to, so
// that the edge need not ask (nodeproto.HeaderResolution): only for a caller who may create in
// its project, so a refusal never tells another project's catalogue. A create it cannot resolve
// goes without: the edge asks, and answers (and audits) the refusal as it always did.
func (s *Server) resolve(r *http.Request, req model.CreateRequest) *catalog.Resolution {
	if apiserver.Require(r, iam.SandboxCreate, req.Project) != nil {
		return nil
	}
	res, err := s.resolver.Resolve(r.Context(), req, false)
	if err != nil {
		return nil
	}
	return res
}

// stripNodeHeaders removes the node protocol's headers from what a client sends: only this
// replica says who the caller is to an edge.
func stripNodeHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		nodeproto.Strip(r.Header)
		next.ServeHTTP(w, r)
	})
}

// nodeAction cordons, drains or uncordons a node (operator).
func (s *Server) nodeAction(w http.ResponseWriter, r *http.Request) {
	if err := apiserver.Require(r, iam.Operator, ""); err != nil {
		httpjson.Error(w, r, s.log, err)
		return
	}
	state := map[string]string{"cordon": model.NodeCordoned, "drain": model.NodeDraining, "uncordon": model.NodeReady}[r.PathValue("action")]
	if state == "" {
		httpjson.Error(w, r, s.log, errdefs.Invalid("action", "%q: want cordon, drain or uncordon", r.PathValue("action")))
		return
	}
	n, err := s.store.SetNodeState(r.Context(), r.PathValue("name"), state)
	if err != nil {
		httpjson.Error(w, r, s.log, err)
		return
	}
	s.log.Info("node state set", "node", n.Name, "state", n.State)
	s.nodeEvent(r.Context(), n.Name, n.State)
	s.refresh(r.Context(), true)
	httpjson.Write(w, http.StatusOK, n)
}

// forgetEvery is how often a replica deletes the records of sandboxes ended longer ago than
// their retention, every node's (a lost node's included).
const forgetEvery = 10 * time.Minute

// forgetEnded deletes ended sandboxes' records past the retention every forgetEvery, from a
// minute after the start, until ctx ends. Every replica does it; the deletes do not conflict.
func (s *Server) forgetEnded(ctx context.Context) {
	wait := time.Minute
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = forgetEvery
		n, err := s.store.ForgetEnded(ctx, time.Now().Add(-s.cfg.SandboxRetention))
		switch {
		case err != nil:
			s.log.Warn("forget ended sandboxes", "err", err)
		case n > 0:
			s.log.Info("forgot ended sandboxes", "records", n, "retention", s.cfg.SandboxRetention)
		}
	}
}

// watch declares lost nodes and keeps the node list fresh until ctx ends.
//
// Edges heartbeat through the servers: after an outage of every replica each node's lease has
// run out, though its edge kept trying. So a replica declares nothing lost until it has been up
// for the longest lease a node holds (sweepAfter): every edge that is alive has heartbeated
// through it or another replica by then.
func (s *Server) watch(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	// The first read of the nodes must succeed: a replica that starts while the store is still
	// coming back has nothing to measure the longest lease by.
	var first []model.Node
	for {
		list, err := s.store.ListNodes(ctx)
		if err == nil {
			first = list
			break
		}
		s.log.Warn("read the nodes before sweeping any; trying again", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	sweepFrom := time.Now().Add(sweepAfter(first))
	if wait := time.Until(sweepFrom); wait > 0 {
		s.log.Info("declaring no node lost until the longest lease has passed since this replica started", "wait", wait.Round(time.Millisecond))
	}
	for {
		var lost []string
		var failed int
		var err error
		if !time.Now().Before(sweepFrom) {
			lost, failed, err = s.store.SweepLostNodes(ctx, s.cfg.LeaseGrace)
		}
		switch {
		case err != nil:
			s.log.Warn("sweep lost nodes", "err", err)
		case len(lost) > 0:
			s.log.Warn("nodes lost: their lease ran out past the grace period", "nodes", lost, "sandboxes_failed", failed, "grace", s.cfg.LeaseGrace)
			for _, n := range lost {
				s.nodeEvent(ctx, n, model.NodeLost)
			}
		}
		s.refresh(ctx, true)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sweepAfter is the longest lease of nodes (a heartbeat's lease is its expiry less its time),
// within nodeproto's bounds.
func sweepAfter(nodes []model.Node) time.Duration {
	var d time.Duration
	for _, n := range nodes {
		if n.State != model.NodeLost {
			d = max(d, n.LeaseExpiresAt.Sub(n.HeartbeatAt))
		}
	}
	return min(d, nodeproto.MaxLeaseTTL)
}

// refresh rereads the nodes table when the copy is older than a second (or when forced).
func (s *Server) refresh(ctx context.Context, force bool) []model.Node {
	s.mu.Lock()
	if !force && time.Since(s.readAt) < time.Second {
		defer s.mu.Unlock()
		return s.nodes
	}
	s.mu.Unlock()
	list, err := s.store.ListNodes(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.log.Warn("read the nodes", "err", err)
		return s.nodes
	}
	s.nodes, s.readAt = list, time.Now()
	return list
}

// node returns the node named name as last read, reading again if it is not there (it may have
// joined since).
func (s *Server) node(ctx context.Context, name string) (model.Node, bool) {
	for _, force := range []bool{false, true} {
		for _, n := range s.refresh(ctx, force) {
			if n.Name == name {
				return n, true
			}
		}
	}
	return model.Node{}, false
}

// upNodes returns the nodes that are not lost, reading again when none is (one may have joined
// since).
func (s *Server) upNodes(ctx context.Context) []model.Node {
	var up []model.Node
	for _, force := range []bool{false, true} {
		for _, n := range s.refresh(ctx, force) {
			if n.State != model.NodeLost {
				up = append(up, n)
			}
		}
		if len(up) > 0 {
			break
		}
	}
	return up
}

// tlsConfigs issues this replica's certificate and returns the TLS configurations it calls
// edges with (the cluster CA; per node: ForNode) and serves the node channel with (edges'
// certificates required). Both read the certificate per handshake (certificate), so a reissue
// reaches both.
func (s *Server) tlsConfigs() (client, nodes *tls.Config, err error) {
	certPEM, keyPEM, err := s.ca.IssueServer(s.name, serverTTL)
	if err != nil {
		return nil, nil, err
	}
	if client, err = clusterauth.ServerTLS(s.ca.CertPEM(), certPEM, keyPEM); err != nil {
		return nil, nil, err
	}
	if nodes, err = clusterauth.NodeChannelTLS(s.ca.CertPEM(), certPEM, keyPEM); err != nil {
		return nil, nil, err
	}
	s.cert = &client.Certificates[0]
	client.Certificates, nodes.Certificates = nil, nil
	client.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return s.certificate(), nil }
	nodes.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.certificate(), nil }
	return client, nodes, nil
}

// certificate returns this replica's certificate, which it calls edges with and serves the node
// channel with, reissued first when half its life has passed.
func (s *Server) certificate() *tls.Certificate {
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Until(s.cert.Leaf.NotAfter) < serverTTL/2 {
		certPEM, keyPEM, err := s.ca.IssueServer(s.name, serverTTL)
		if err == nil {
			var c tls.Certificate
			if c, err = tls.X509KeyPair(certPEM, keyPEM); err == nil {
				s.cert = &c
			}
		}
		if err != nil {
			s.log.Error("reissue this replica's certificate", "err", err, "expires", s.cert.Leaf.NotAfter)
		}
	}
	return s.cert
}

// conn returns how to reach node n's edge.
func (s *Server) conn(n model.Node) (*edgeConn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := fmt.Sprintf("%s %s %d", n.Name, n.URL, n.Protocol) // an upgraded edge speaks anew
	if c, ok := s.conns[key]; ok {
		return c, nil
	}
	u, err := url.Parse(n.URL)
	if err != nil || u.Scheme != "https" {
		return nil, errdefs.Unavailable("node %s registered URL %q: servers reach edges over https only (is the edge older than this server?)", n.Name, n.URL)
	}
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 3 * time.Second}).DialContext,
		TLSClientConfig:     clusterauth.ForNode(s.tls, n.Name),
		TLSHandshakeTimeout: 5 * time.Second,
		MaxIdleConnsPerHost: 64,
		// A request that asks (a build) is sent its body once the edge takes it.
		ExpectContinueTimeout: 10 * time.Second,
		ForceAttemptHTTP2:     true,
		// One HTTP/2 connection per edge, pinged when quiet: a partitioned edge (no RST ever
		// comes back) fails its requests and streams within seconds instead of hanging them.
		HTTP2: &http.HTTP2Config{SendPingTimeout: edgePingEvery, PingTimeout: edgePingTimeout},
	}
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.Out.Host = pr.In.Host
			if err := s.asCaller(pr.In, n, pr.Out.Header); err != nil {
				pr.Out.Header.Del("Authorization") // the edge answers 401; the token stays here
				s.log.Error("send the caller to an edge", "node", n.Name, "err", err)
			}
			trace.Inject(pr.Out.Context(), pr.Out.Header) // the edge's spans join this replica's trace
		},
		Transport:     tr,
		FlushInterval: -1, // streams (exec output, attach) pass through as they come
		ModifyResponse: func(resp *http.Response) error {
			nodeproto.Strip(resp.Header) // the protocol's refusals are for this replica
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// When the edge cannot be reached (it may have stopped, or been cut off, since the
			// node list was read: a failed dial, or a connection that broke), a sandbox's record
			// is read from the store here, as it was last written, and a read that is not about
			// one sandbox, which any edge answers from the shared store, goes to another edge,
			// and so on until one answers or every edge was tried. Nothing was written to w yet.
			// An edge that answered with the wrong identity (a TLS or certificate failure) is
			// reported, never skipped.
			id := r.PathValue("id")
			if id != "" && recordRead(r, id) && r.Context().Err() == nil && unreachable(err) {
				s.serveStoredRecord(w, r, id)
				return
			}
			if r.Method == http.MethodGet && id == "" {
				if r.Context().Err() == nil && unreachable(err) {
					tried, _ := r.Context().Value(triedEdges{}).([]string)
					tried = append(slices.Clip(tried), n.URL)
					s.toAnyExcept(w, r.WithContext(context.WithValue(r.Context(), triedEdges{}, tried)), tried...)
					return
				}
			}
			gone := unreachable(err)
			err = errdefs.Unavailable("edge %s (%s) did not answer: %v", n.Name, u.Host, err)
			if gone {
				// Transient: the edge comes back (a restart), or is declared lost within its
				// lease and grace, after which its sandboxes answer as failed. Either way a
				// retry soon gets the real answer.
				err = errdefs.Retryable(err, time.Second)
			}
			httpjson.Error(w, r, s.log, err)
		},
	}
	// Upgrades: HTTP/1.1 only (a TLSNextProto that is empty but not nil turns HTTP/2 off, and
	// ALPN offers http/1.1 alone), one connection per upgraded request, spliced both ways by the
	// reverse proxy once the edge answers 101.
	up := *p
	upTLS := clusterauth.ForNode(s.tls, n.Name)
	upTLS.NextProtos = []string{"http/1.1"}
	up.Transport = &http.Transport{
		DialContext:         tr.DialContext,
		TLSClientConfig:     upTLS,
		TLSHandshakeTimeout: tr.TLSHandshakeTimeout,
		TLSNextProto:        map[string]func(string, *tls.Conn) http.RoundTripper{},
		DisableKeepAlives:   true,
	}
	c := &edgeConn{client: &http.Client{Transport: tr}, proxy: p, upgrade: &up}
	s.conns[key] = c
	return c, nil
}

// toOwner sends a request about one sandbox to the node that runs it. A lost node's records are
// still read (from any edge: they share the store); anything else about its sandboxes is 503.
func (s *Server) toOwner(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !edge.ValidID(id) {
		httpjson.Error(w, r, s.log, errdefs.Invalid("id", "%q is not a sandbox ID (sb-NODE-XXXXXXXXXXXXXXXX)", id))
		return
	}
	name := edge.NodeOf(id)
	n, ok := s.node(r.Context(), name)
	switch {
	case !ok:
		httpjson.Error(w, r, s.log, errdefs.NotFound("sandbox %s (no node %s in this cluster)", id, name))
		return
	case n.State == model.NodeLost && recordRead(r, id):
		s.serveStoredRecord(w, r, id) // failed with node_lost
		return
	case n.State == model.NodeLost:
		httpjson.Error(w, r, s.log, errdefs.Unavailable("sandbox %s: node %s is lost (its sandboxes failed with %s)", id, name, model.ReasonNodeLost))
		return
	}
	c, err := s.conn(n)
	if err != nil {
		httpjson.Error(w, r, s.log, err)
		return
	}
	if n.Protocol >= nodeproto.Version {
		// The edge authorises the request on the sandbox's project as it is now (moves
		// included) without a read of its own.
		project, known, answered := s.sandboxProject(w, r, id)
		if answered {
			return
		}
		if known {
			r = apiserver.OnSandbox(r, id, project)
		}
	}
	r, span := trace.StartRequest(r, trace.Route, trace.Sandbox(id), trace.Node(name))
	defer span.End(nil)
	c.serve(w, r)
}

// recordRead reports whether r reads the record of sandbox id (GET /v1/sandboxes/{id}, without
// waiting for a state).
func recordRead(r *http.Request, id string) bool {
	return r.Method == http.MethodGet && r.URL.Path == "/v1/sandboxes/"+id && r.URL.Query().Get("wait") == ""
}

// sandboxProject returns the canonical path of the project of sandbox id, for r on its way to
// the sandbox's edge; known is false when the store could not say (not found: the edge says
// so). A read of the record of a sandbox that ended is answered here instead (answered): the
// edge holds only its live sandboxes' records.
func (s *Server) sandboxProject(w http.ResponseWriter, r *http.Request, id string) (project string, known, answered bool) {
	if !recordRead(r, id) {
		p, err := s.store.SandboxProject(r.Context(), id)
		return p, err == nil, false
	}
	rec, err := s.store.GetSandbox(r.Context(), id)
	if err != nil {
		httpjson.Error(w, r, s.log, err)
		return "", false, true
	}
	if rec.State != model.StateStopped && rec.State != model.StateFailed {
		p, err := iam.ParsePath("project", rec.Project) // the record's display form
		return p, err == nil, false
	}
	s.serveRecord(w, r, rec)
	return "", false, true
}

// serveStoredRecord answers a read of sandbox id's record from the store (serveRecord).
func (s *Server) serveStoredRecord(w http.ResponseWriter, r *http.Request, id string) {
	rec, err := s.store.GetSandbox(r.Context(), id)
	if err != nil {
		httpjson.Error(w, r, s.log, err)
		return
	}
	s.serveRecord(w, r, rec)
}

// serveRecord answers a read of rec as the edge would: the record, or the caller's refusal.
func (s *Server) serveRecord(w http.ResponseWriter, r *http.Request, rec *store.Sandbox) {
	project, err := iam.ParsePath("project", rec.Project) // the record's display form
	if err == nil {
		err = apiserver.Require(r, iam.SandboxRead, project)
	}
	if err != nil {
		httpjson.Error(w, r, s.log, err)
		return
	}
	httpjson.Write(w, http.StatusOK, rec.Sandbox)
}

// toAny sends a request that is not about one sandbox to a ready (or at least not lost) edge,
// round robin: every edge serves the shared store.
func (s *Server) toAny(w http.ResponseWriter, r *http.Request) { s.toAnyExcept(w, r) }

// toNamedNode sends a per-node read (a layer's fetch statistics) to the node its ?node= names,
// or, without one, to any edge (which says which node it is).
func (s *Server) toNamedNode(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("node")
	if name == "" {
		s.toAny(w, r)
		return
	}
	s.toNode(w, r, name)
}

// toBuildNode sends a request about one build to the node that runs it (its ID names it):
// builds, their logs included, live in the memory of their edge.
func (s *Server) toBuildNode(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	name := build.NodeOf(id)
	if name == "" {
		httpjson.Error(w, r, s.log, errdefs.NotFound("build %s", id))
		return
	}
	s.toNode(w, r, name)
}

// toNode sends r to node name's edge.
func (s *Server) toNode(w http.ResponseWriter, r *http.Request, name string) {
	n, ok := s.node(r.Context(), name)
	switch {
	case !ok:
		httpjson.Error(w, r, s.log, errdefs.NotFound("node %s (corral node ls)", name))
		return
	case n.State == model.NodeLost:
		httpjson.Error(w, r, s.log, errdefs.Unavailable("node %s is lost", name))
		return
	}
	c, err := s.conn(n)
	if err != nil {
		httpjson.Error(w, r, s.log, err)
		return
	}
	c.serve(w, r)
}

// toAnyExcept is toAny avoiding the edges at skip (ones that just did not answer). Draining
// nodes serve only when no other is up: they have wound their fncall pools down.
func (s *Server) toAnyExcept(w http.ResponseWriter, r *http.Request, skip ...string) {
	var up, draining []model.Node
	for _, n := range s.upNodes(r.Context()) {
		switch {
		case slices.Contains(skip, n.URL):
		case n.State == model.NodeDraining:
			draining = append(draining, n)
		default:
			up = append(up, n)
		}
	}
	if len(up) == 0 {
		up = draining
	}
	if len(up) == 0 {
		msg := "no edge has joined this cluster, or all are lost (corral node ls)"
		if len(skip) > 0 {
			msg = fmt.Sprintf("no edge answered (tried %s; corral node ls)", strings.Join(skip, ", "))
		}
		httpjson.Error(w, r, s.log, errdefs.Unavailable("%s", msg))
		return
	}
	n := up[s.rr.Add(1)%uint64(len(up))]
	c, err := s.conn(n)
	if err != nil {
		httpjson.Error(w, r, s.log, err)
		return
	}
	c.serve(w, r)
}

// maxCreateBody bounds a create's body (it is read whole to place it).
const maxCreateBody = 1 << 20

// create places a new sandbox and forwards its create to the chosen node, trying another when a
// node does not answer or answers that it is unavailable.
func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxCreateBody))
	if err != nil {
		httpjson.Error(w, r, s.log, errdefs.Invalid("body", "read the request (at most 1 MiB): %v", err))
		return
	}
	var req model.CreateRequest
	if err := json.Unmarshal(body, &req); err != nil {
		httpjson.Error(w, r, s.log, errdefs.Invalid("body", "not a create request: %v", err))
		return
	}
	project, groups, err := s.projectGroups(r, req.Project)
	if err == nil {
		err = placement.ValidateLabels("node_selector", req.NodeSelector)
	}
	resolved, res := req, (*catalog.Resolution)(nil)
	if err == nil {
		resolved.Project = project // as the edge's API fills it in
		res = s.resolve(r, resolved)
	}
	if err == nil && req.Environment != "" && req.Tier == "" && req.Runtime == "" {
		// The environment's tier and runtime are the create's when it names none (the edge
		// applies them the same way): a microvm environment is placed on a node with microvms.
		if res != nil {
			req.Tier, req.Runtime = res.Request.Tier, res.Request.Runtime
		} else if env, gerr := s.store.GetEnvironment(r.Context(), req.Environment); gerr == nil {
			req.Tier, req.Runtime = env.Tier, env.Runtime
		}
	}
	tier := req.Tier
	if tier == "" {
		tier = limits.TierContainer
	}
	// The limits are resolved by the same policy as the edge's, before placement: a limit left
	// out is placed as its default, and one out of its tier's bounds is refused here, not by
	// every node in turn. (A tier the table does not know is the edge's to refuse.)
	lim := limits.Limits(req.Limits)
	if _, ok := clusterLimits.Bounds(tier); ok && err == nil {
		lim, err = clusterLimits.Resolve(tier, lim)
	}
	if err != nil {
		httpjson.Error(w, r, s.log, err)
		return
	}
	preq := placement.Request{Tier: tier, Runtime: req.Runtime, CPUs: lim.CPUs, MemoryBytes: lim.MemoryBytes, DiskBytes: lim.DiskBytes,
		Require: req.NodeSelector, Pin: selectors(groups.Effective.Pin), Avoid: selectors(groups.Effective.Avoid)}
	ctx, span := trace.Start(r.Context(), trace.Placement, trace.Project(iam.Display(project)), trace.Tier(preq.Tier))
	if len(req.Volumes) > 0 {
		// Nodes that cache the volumes' current versions skip a download (edge/volblob.go).
		names := make([]string, len(req.Volumes))
		for i, v := range req.Volumes {
			names[i] = v.Name
		}
		if preq.Prefer, err = s.store.VolumeCopyNodes(ctx, project, names); err != nil {
			s.log.Warn("find the nodes caching a create's volumes", "err", err)
		}
	}
	nodes := placementNodes(s.upNodes(ctx))
	var resp *http.Response
	node, err := s.placer.PlaceWithRetry(ctx, preq, nodes, func(ctx context.Context, name string) error {
		var err error
		resp, err = s.offer(ctx, r, name, "/v1/sandboxes", bytes.NewReader(body), func(h http.Header) {
			if res != nil {
				nodeproto.SetResolution(h, resolved, res)
			}
		})
		if errors.As(err, new(maybeSent)) {
			// It may have reached the node: trying another could make a second sandbox (a
			// client's retry with an Idempotency-Key cannot).
			err = errdefs.Unavailable("node %s: %v (the create may have happened; retry with an Idempotency-Key)", name, err)
			if r.Header.Get("Idempotency-Key") != "" {
				// With a key the retry is safe, and finds the sandbox if the create happened.
				err = errdefs.Retryable(err, time.Second)
			}
		}
		return err
	}, s.cfg.MaxTries)
	span.Set(trace.Node(node), trace.Int("corral.nodes", len(nodes)))
	span.End(&err)
	if err != nil {
		// No node fits: 429 when the cluster (or the part the request may use) is full or the
		// nodes refused it for room, 503 when no node could take it at all. When the last node
		// tried could not be reached or was unavailable for a moment (restarting, a create with
		// the same key still at work on it), that is no answer about room: a retryable 503.
		if errors.Is(err, errNodeUnavailable) {
			err = errdefs.Retryable(errdefs.Unavailable("no node could take the sandbox now (%v); retry", err), time.Second)
		}
		httpjson.Error(w, r, s.log, err)
		return
	}
	relayPlaced(w, resp, node)
}

// projectGroups returns the project an Authenticated request names (path, or its token's) and
// its node groups: its own placement or an ancestor's (the edge checks the rest).
func (s *Server) projectGroups(r *http.Request, path string) (string, *model.ProjectPlacement, error) {
	project, err := apiserver.CallerProject(r, "project", path)
	var groups *model.ProjectPlacement
	if err == nil {
		groups, err = s.store.ProjectPlacement(r.Context(), project)
	}
	if errors.Is(err, errdefs.ErrNotFound) {
		err = errdefs.Invalid("project", "project %s does not exist", iam.Display(project))
	}
	return project, groups, err
}

// relayPlaced passes the answer of the edge of node, which took what was placed there (an
// offer), to the client.
func relayPlaced(w http.ResponseWriter, resp *http.Response, node string) {
	defer resp.Body.Close()
	nodeproto.Strip(resp.Header)
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.Header().Set("Corral-Node", node)
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body)
}

// maybeSent is an offer's call that failed after the request may have reached the node:
// trying another node could do the work twice.
type maybeSent struct{ error }

func (e maybeSent) Unwrap() error { return e.error }

// offer sends r's caller's request to place something on node name (POST path: a create, a
// build; body and set, which adds to the header) and sorts the answer for PlaceWithRetry: a
// request that never reached the node, a refusal for room (node_full) and a node unavailable for
// the moment (503) are placement.ErrRefused (the first and the last with errNodeUnavailable as
// well: no answer about room), a call that failed after it may have reached the node is a
// maybeSent, and any other answer is the client's (resp).
func (s *Server) offer(ctx context.Context, r *http.Request, name, path string, body io.Reader, set func(h http.Header)) (*http.Response, error) {
	n, _ := s.node(ctx, name)
	c, err := s.conn(n)
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, placement.ErrRefused)
	}
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(n.URL, "/")+path, body)
	if err != nil {
		return nil, err
	}
	out.Header = r.Header.Clone()
	if err := s.asCaller(r, n, out.Header); err != nil {
		return nil, err
	}
	if set != nil {
		set(out.Header)
	}
	trace.Inject(ctx, out.Header) // the edge's work is a child of this placement
	resp, err := c.client.Do(out)
	if neverSent(err) {
		// The request never reached the node: safe to try another.
		s.log.Warn("node did not take a request; trying another", "node", name, "path", path, "err", err)
		return nil, fmt.Errorf("node %s: %v: %w: %w", name, err, placement.ErrRefused, errNodeUnavailable)
	}
	if err != nil {
		return nil, maybeSent{err}
	}
	// The edge has the final say: its refusals send the request elsewhere; any other answer
	// is the client's to see.
	ref := nodeproto.Refused(resp.Header)
	if ref == nodeproto.None && n.Protocol == 0 && resp.StatusCode == http.StatusConflict {
		ref = legacyRefusal(resp)
	}
	switch {
	case ref == nodeproto.NodeFull:
		// No room, draining, or labels that do not match.
		why := refusalMessage(resp)
		s.log.Info("node refused; trying another", "node", name, "path", path, "refusal", ref, "why", why)
		return nil, fmt.Errorf("node %s: %s: %w", name, why, placement.ErrRefused)
	case resp.StatusCode == http.StatusServiceUnavailable:
		// Restarting, a create with the same key still at work, an incarnation the cluster
		// fenced off (stale_epoch), a release that cannot talk to this one (version): no
		// answer about room.
		why := refusalMessage(resp)
		s.log.Info("node unavailable; trying another", "node", name, "path", path, "refusal", ref, "why", why)
		return nil, fmt.Errorf("node %s is unavailable: %s: %w: %w", name, why, placement.ErrRefused, errNodeUnavailable)
	}
	return resp, nil
}

// legacyRefusal reads the refusal an edge older than the node protocol says only in its 409's
// body code, and puts the body back (goes with the protocol's next version).
func legacyRefusal(resp *http.Response) nodeproto.Refusal {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(b))
	var e model.Error
	if json.Unmarshal(b, &e) == nil && e.Code == string(nodeproto.NodeFull) {
		return nodeproto.NodeFull
	}
	return nodeproto.None
}

// refusalMessage reads (and closes) the body of an edge's refusal for its message.
func refusalMessage(resp *http.Response) string {
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e model.Error
	if json.Unmarshal(b, &e) != nil || e.Message == "" {
		return fmt.Sprintf("refused (%s, %s)", resp.Status, resp.Header.Get(nodeproto.HeaderRefusal))
	}
	return e.Message
}

// errNodeUnavailable marks a placement refusal by a node that could not take a create at the
// moment (unreachable, or answering 503), as opposed to one without room.
var errNodeUnavailable = errors.New("node unavailable")

// How a replica notices an edge it cannot hear: a ping after edgePingEvery of silence on the
// connection, given up after edgePingTimeout.
const (
	edgePingEvery   = 2 * time.Second
	edgePingTimeout = 3 * time.Second
)

// triedEdges carries the URLs of the edges a read was sent to and that did not answer.
type triedEdges struct{}

// neverSent reports whether a call to an edge failed before the request could reach it: the
// connection was not made, or the edge's TLS handshake failed (a certificate the cluster CA does
// not vouch for, or one for another node).
func neverSent(err error) bool {
	if opErr, ok := errors.AsType[*net.OpError](err); ok && opErr.Op == "dial" {
		return true
	}
	_, verify := errors.AsType[*tls.CertificateVerificationError](err)
	_, record := errors.AsType[tls.RecordHeaderError](err)
	return verify || record
}

// selectors converts a project placement's label sets.
func selectors(list []map[string]string) []placement.Selector {
	out := make([]placement.Selector, len(list))
	for i, s := range list {
		out[i] = s
	}
	return out
}

// placementNodes converts the nodes table for placement.
func placementNodes(list []model.Node) []placement.Node {
	out := make([]placement.Node, 0, len(list))
	res := func(r model.Resources) placement.Resources {
		return placement.Resources{CPUs: r.CPUs, MemoryBytes: r.MemoryBytes, DiskBytes: r.DiskBytes, Sandboxes: r.Sandboxes}
	}
	for _, n := range list {
		out = append(out, placement.Node{
			Name: n.Name, State: placement.State(n.State), Tiers: n.Tiers, Runtimes: n.Runtimes, Labels: n.Labels,
			Capacity: res(n.Capacity), Used: res(n.Used), ReportedAt: n.HeartbeatAt,
		})
	}
	return out
}

// unreachable reports whether a proxy error means the edge could not be reached (a failed dial,
// or a connection that broke: the edge stopped or was cut off), not that it answered wrongly.
func unreachable(err error) bool {
	if opErr, ok := errors.AsType[*net.OpError](err); ok && opErr.Op == "dial" {
		return true
	}
	msg := err.Error()
	if strings.Contains(msg, "certificate") || strings.Contains(msg, "tls:") {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		strings.Contains(msg, "connection lost") || strings.Contains(msg, "connection reset")
}

// nodeEvent records a node's state change in the store's events, which every edge's followers
// read in cluster mode (GET /v1/events; operators see them: they belong to the root project).
func (s *Server) nodeEvent(ctx context.Context, node, state string) {
	ev := events.Event{ID: fmt.Sprintf("ev-server-%x-%s", time.Now().UnixNano(), node), At: time.Now().UTC(),
		Type: events.NodeState, Node: node, Reason: state}
	if err := s.store.AddEvents(context.WithoutCancel(ctx), []events.Event{ev}); err != nil {
		s.log.Warn("record node event", "node", node, "err", err)
	}
}
