package cluster

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/apiserver"
	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/clusterauth"
	"github.com/corral-dev/corral/internal/edge"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/lazyregexp"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/nodeproto"
	"github.com/corral-dev/corral/internal/placement"
	"github.com/corral-dev/corral/internal/store"
)

// The node channel (internal/nodeproto): edges register, heartbeat and record their events
// through the servers instead of in the store. Every replica serves it on its node listener,
// over mutual TLS under the cluster CA; the node is the one the edge's certificate names.

// maxNodeBody bounds a node channel request (an events batch of nodeproto.MaxEvents is well
// under it).
const maxNodeBody = 8 << 20

// nodeHandler serves the node channel.
func (s *Server) nodeHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+nodeproto.PathRegister, nodeCall(s, maxNodeBody, s.nodeRegister))
	mux.HandleFunc("POST "+nodeproto.PathHeartbeat, nodeCall(s, maxNodeBody, s.nodeHeartbeat))
	mux.HandleFunc("POST "+nodeproto.PathEvents, nodeCall(s, maxNodeBody, s.nodeEvents))
	mux.HandleFunc("POST "+nodeproto.PathActivity, nodeCall(s, maxNodeBody, s.nodeActivity))
	mux.HandleFunc("POST "+nodeproto.PathConfig, nodeCall(s, maxNodeBody, s.nodeConfig))
	mux.HandleFunc("POST "+nodeproto.PathArtifactLimits, nodeCall(s, maxNodeBody, s.nodeArtifactLimits))
	mux.HandleFunc("POST "+nodeproto.PathSandbox, nodeCall(s, maxNodeBody, s.nodeSandbox))
	mux.HandleFunc("POST "+nodeproto.PathSteps, nodeCall(s, nodeproto.MaxStepsBody, s.nodeSteps))
	mux.HandleFunc("POST "+nodeproto.PathListSteps, nodeCall(s, maxNodeBody, s.nodeListSteps))
	mux.HandleFunc("POST "+nodeproto.PathVolume, nodeCall(s, maxNodeBody, s.nodeVolume))
	mux.HandleFunc("POST "+nodeproto.PathVolumeCommit, nodeCall(s, maxNodeBody, s.nodeVolumeCommit))
	mux.HandleFunc("POST "+nodeproto.PathVolumeCopy, nodeCall(s, maxNodeBody, s.nodeVolumeCopy))
	mux.HandleFunc("POST "+nodeproto.PathVolumeVersions, nodeCall(s, maxNodeBody, s.nodeVolumeVersions))
	mux.HandleFunc("POST "+nodeproto.PathDigestsInUse, nodeCall(s, maxNodeBody, s.nodeDigestsInUse))
	mux.HandleFunc("POST "+nodeproto.PathAdmit, nodeCall(s, maxNodeBody, s.nodeAdmit))
	mux.HandleFunc("POST "+nodeproto.PathIdempotency, nodeCall(s, maxNodeBody, s.nodeIdempotency))
	mux.HandleFunc("POST "+nodeproto.PathReleaseKey, nodeCall(s, maxNodeBody, s.nodeReleaseKey))
	mux.HandleFunc("POST "+nodeproto.PathResolve, nodeCall(s, maxNodeBody, s.nodeResolve))
	mux.HandleFunc("POST "+nodeproto.PathPublishLayer, nodeCall(s, maxNodeBody, s.nodePublishLayer))
	mux.HandleFunc("POST "+nodeproto.PathSetLayer, nodeCall(s, maxNodeBody, s.nodeSetLayer))
	mux.HandleFunc("POST "+nodeproto.PathDeleteLayer, nodeCall(s, maxNodeBody, s.nodeDeleteLayer))
	mux.HandleFunc("POST "+nodeproto.PathEnvironment, nodeCall(s, maxNodeBody, s.nodeEnvironment))
	mux.HandleFunc("POST "+nodeproto.PathAudit, nodeCall(s, maxNodeBody, s.nodeAudit))
	mux.HandleFunc("POST "+nodeproto.PathCatalogRead, nodeCall(s, maxNodeBody, s.nodeCatalogRead))
	mux.HandleFunc("POST "+nodeproto.PathGetSandbox, nodeCall(s, maxNodeBody, s.nodeGetSandbox))
	return clusterauth.RequireEdge(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Get(nodeproto.HeaderVersion); v != strconv.Itoa(nodeproto.Version) {
			httpjson.Error(w, r, s.log, fmt.Errorf("this server speaks node protocol %d; the edge speaks %q (upgrade the older side): %w", nodeproto.Version, v, nodeproto.ErrVersion))
			return
		}
		mux.ServeHTTP(w, r)
	}))
}

// nodeCall serves one call of the node channel: it decodes the request (at most limit bytes),
// runs do for the node the edge's certificate names, and answers what do returns (204 when
// nil) or its error. A refusal (denied or invalid) is logged: an edge that sends one is broken
// or stolen.
func nodeCall[Req, Resp any](s *Server, limit int64, do func(ctx context.Context, node string, req *Req) (*Resp, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		node := clusterauth.EdgeNode(r)
		var req Req
		if err := httpjson.DecodeLimit(r, &req, limit); err != nil {
			httpjson.Error(w, r, s.log, err)
			return
		}
		out, err := do(r.Context(), node, &req)
		switch {
		case errors.As(err, new(clientRefusal)):
			httpjson.Error(w, r, s.log, err)
		case errors.Is(err, errdefs.ErrDenied) || errors.Is(err, errdefs.ErrInvalid):
			s.log.Warn("node channel call refused", "node", node, "path", r.URL.Path, "remote", r.RemoteAddr, "err", err)
			httpjson.Error(w, r, s.log, err)
		case err != nil:
			httpjson.Error(w, r, s.log, err)
		case out == nil:
			w.WriteHeader(http.StatusNoContent)
		default:
			httpjson.Write(w, http.StatusOK, out)
		}
	}
}

// clientRefusal marks a refusal of what an edge relays from its client (a create naming a layer
// not published, say): the client's mistake, answered as it is, and not logged as a refused
// call of the edge's.
type clientRefusal struct{ error }

func (e clientRefusal) Unwrap() error { return e.error }

// ownSandbox fails unless id is a sandbox of node: nothing an edge sends speaks for another.
func ownSandbox(node, field, id string) error {
	if edge.NodeOf(id) != node {
		return fmt.Errorf("%s: %q is not a sandbox of node %s: %w", field, id, node, errdefs.ErrDenied)
	}
	return nil
}

// nodeRegister starts a new incarnation of the caller's node, and answers what the edge starts
// from.
func (s *Server) nodeRegister(ctx context.Context, node string, req *nodeproto.RegisterRequest) (*nodeproto.RegisterResponse, error) {
	ttl, err := checkRegister(req)
	if err != nil {
		return nil, err
	}
	n, err := s.store.Register(ctx, store.Node{
		Name: node, URL: req.URL, Capacity: req.Capacity, Labels: req.Labels,
		Tiers: req.Tiers, Runtimes: req.Runtimes, Protocol: req.Protocol,
	}, ttl)
	if err != nil {
		return nil, err
	}
	s.log.Info("node registered", "node", node, "epoch", n.Epoch, "state", n.State, "url", n.URL)
	s.refresh(ctx, true)
	// What the edge starts from, read after its incarnation fenced off the older ones: from now
	// on only it writes these records (a sweep would fence it first).
	out := &nodeproto.RegisterResponse{Node: *n, Features: nodeproto.Features}
	if out.Instance, err = s.store.Instance(ctx, node); err != nil {
		return nil, fmt.Errorf("node %s's instance name: %w", node, err)
	}
	if out.Sandboxes, err = s.store.ListSandboxes(ctx, store.SandboxFilter{Node: node, States: store.OwnStates()}); err != nil {
		return nil, fmt.Errorf("node %s's sandboxes: %w", node, err)
	}
	return out, nil
}

// checkRegister validates a registration and returns its lease TTL.
func checkRegister(req *nodeproto.RegisterRequest) (time.Duration, error) {
	ttl, err := nodeproto.LeaseTTL(req.LeaseTTLMillis)
	if err != nil {
		return 0, err
	}
	if err := checkHTTPS(req.URL); err != nil {
		return 0, errdefs.Invalid("url", "%q: %v: servers reach edges at https://HOST:PORT", req.URL, err)
	}
	if req.Protocol != nodeproto.Version {
		return 0, fmt.Errorf("the edge speaks node protocol %d, this server %d (upgrade the older side): %w", req.Protocol, nodeproto.Version, nodeproto.ErrVersion)
	}
	c := req.Capacity
	if c.CPUs < 0 || c.MemoryBytes < 0 || c.DiskBytes < 0 || c.Sandboxes < 0 {
		return 0, errdefs.Invalid("capacity", "%+v: no resource is negative", c)
	}
	if err := placement.ValidateLabels("labels", req.Labels); err != nil {
		return 0, errdefs.Invalid("labels", "%v", err)
	}
	for _, f := range []struct {
		name string
		list []string
	}{{"tiers", req.Tiers}, {"runtimes", req.Runtimes}} {
		if len(f.list) > 16 || slices.ContainsFunc(f.list, func(v string) bool { return v == "" || len(v) > 32 }) {
			return 0, errdefs.Invalid(f.name, "%q: at most 16 names of 1-32 characters", f.list)
		}
	}
	return ttl, nil
}

// checkHTTPS fails unless u is https://HOST:PORT with nothing else.
func checkHTTPS(u string) error {
	rest, ok := strings.CutPrefix(u, "https://")
	if !ok {
		return fmt.Errorf("not https://")
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil || host == "" {
		return fmt.Errorf("not https://HOST:PORT")
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("port %q", port)
	}
	return nil
}

// nodeHeartbeat renews the caller's lease with what its live sandboxes use, counted here, and
// names the configuration's generation.
func (s *Server) nodeHeartbeat(ctx context.Context, node string, req *nodeproto.HeartbeatRequest) (*nodeproto.HeartbeatResponse, error) {
	ttl, err := nodeproto.LeaseTTL(req.LeaseTTLMillis)
	if err != nil {
		return nil, err
	}
	if err := checkWarmFigures(req.Warm); err != nil {
		// Shown, never acted on: the lease is renewed all the same, without them.
		s.log.Warn("a heartbeat's warm pool figures left out", "node", node, "err", err)
		req.Warm = nil
	}
	used, err := s.store.NodeUsage(ctx, node)
	if err != nil {
		return nil, err
	}
	state, err := s.store.Heartbeat(ctx, node, req.Epoch, used, ttl, req.Warm)
	if err != nil {
		return nil, err
	}
	out := &nodeproto.HeartbeatResponse{State: state, Servers: s.replicaURLs(ctx)}
	if cfg, err := s.nodeConfigNow(ctx, false); err != nil {
		// The lease is renewed all the same; the edge keeps the configuration it holds.
		s.log.Warn("read the configuration edges follow", "err", err)
	} else {
		out.Config = cfg.Generation
	}
	return out, nil
}

// checkWarmFigures refuses a heartbeat's pool figures that no edge reports: too many, an
// environment name no environment could have, or a figure below zero.
func checkWarmFigures(warm map[string]store.WarmFigures) error {
	if len(warm) > nodeproto.MaxWarmFigures {
		return errdefs.Invalid("warm", "%d environments; at most %d", len(warm), nodeproto.MaxWarmFigures)
	}
	for name, f := range warm {
		if err := catalog.ValidateName("warm", "environment", name); err != nil {
			return err
		}
		if f.Ready < 0 || f.Target < 0 || f.Hits < 0 || f.Claims < 0 {
			return errdefs.Invalid("warm", "environment %s: figures %+v are not a pool's", name, f)
		}
	}
	return nil
}

// nodeConfig answers the configuration edges follow.
func (s *Server) nodeConfig(ctx context.Context, _ string, req *nodeproto.ConfigRequest) (*nodeproto.ConfigResponse, error) {
	return s.nodeConfigNow(ctx, req.Fresh)
}

// nodeArtifactLimits answers the limits on the artifacts of an fncall environment's project;
// another project's are refused (an edge keeps artifacts for fncall calls only).
func (s *Server) nodeArtifactLimits(ctx context.Context, _ string, req *nodeproto.ArtifactLimitsRequest) (*nodeproto.ArtifactLimitsResponse, error) {
	ok, err := s.fncallProject(ctx, req.Project)
	switch {
	case err != nil:
		return nil, err
	case !ok:
		return nil, fmt.Errorf("project %q has no fncall environment, so no artifacts on an edge: %w", req.Project, errdefs.ErrDenied)
	}
	limits, err := s.store.ArtifactLimits(ctx, req.Project)
	if err != nil {
		return nil, err
	}
	return &nodeproto.ArtifactLimitsResponse{Limits: limits}, nil
}

// configAge is how long ago the configuration held was read.
func (s *Server) configAge() time.Duration {
	s.configMu.Lock()
	defer s.configMu.Unlock()
	return time.Since(s.configAt)
}

// configFresh is how long a replica answers the configuration it read: every edge's heartbeat
// asks for its generation, and a thousand edges a second make one read of it.
const configFresh = time.Second

// configRead bounds one read of the configuration edges follow.
const configRead = 5 * time.Second

// nodeConfigNow returns the configuration edges follow, read at most every configFresh unless
// fresh. The read is made outside configMu: while one is under way, others are answered the
// copy held (a slow store delays no heartbeat).
func (s *Server) nodeConfigNow(ctx context.Context, fresh bool) (*nodeproto.ConfigResponse, error) {
	s.configMu.Lock()
	held, at := s.config, s.configAt
	if held != nil && !fresh && (time.Since(at) < configFresh || s.configReading) {
		s.configMu.Unlock()
		return held, nil
	}
	s.configReading = true
	s.configMu.Unlock()
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, configRead)
	defer cancel()
	cfg, err := readNodeConfig(rctx, s.store)
	s.configMu.Lock()
	defer s.configMu.Unlock()
	s.configReading = false
	if err != nil {
		return nil, err
	}
	if start.After(s.configAt) {
		s.config, s.configAt = cfg, start
	}
	return cfg, nil
}

// readNodeConfig reads the configuration edges follow from st, with its generation: the digest
// of the rest.
func readNodeConfig(ctx context.Context, st *store.Store) (*nodeproto.ConfigResponse, error) {
	var cfg nodeproto.ConfigResponse
	var err error
	if cfg.WarmEnvironments, err = st.WarmEnvironments(ctx); err != nil {
		return nil, err
	}
	if cfg.FncallEnvs, err = st.ListFncallEnvs(ctx); err != nil {
		return nil, err
	}
	raw, err := st.GetSetting(ctx, store.CatalogSetting)
	switch {
	case err == nil:
		cfg.ServiceCatalog = raw
	case !errors.Is(err, errdefs.ErrNotFound):
		return nil, err
	}
	doc, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(doc)
	cfg.Generation = hex.EncodeToString(sum[:16])
	return &cfg, nil
}

// nodeEvents records a batch of the caller's events. An event of another node, or of a sandbox
// another node runs, refuses the whole batch: nothing an edge sends speaks for anyone else. A
// fenced incarnation's batch is refused as a stale epoch.
func (s *Server) nodeEvents(ctx context.Context, node string, req *nodeproto.EventsRequest) (*struct{}, error) {
	if err := checkEvents(node, req); err != nil {
		return nil, err
	}
	return nil, s.store.AddNodeEvents(ctx, node, req.Epoch, req.Events)
}

// nodeActivity records what the caller's live sandboxes did. A sandbox of another node refuses
// the batch; a fenced incarnation's is refused as a stale epoch.
func (s *Server) nodeActivity(ctx context.Context, node string, req *nodeproto.ActivityRequest) (*struct{}, error) {
	if len(req.Sandboxes) > nodeproto.MaxActivity {
		return nil, errdefs.Invalid("sandboxes", "%d sandboxes: at most %d a batch", len(req.Sandboxes), nodeproto.MaxActivity)
	}
	for i, a := range req.Sandboxes {
		if err := ownSandbox(node, fmt.Sprintf("sandboxes[%d]", i), a.ID); err != nil {
			return nil, err
		}
	}
	return nil, s.store.RecordActivity(ctx, node, req.Epoch, req.Sandboxes)
}

// nodeSandbox records what became of one of the caller's sandboxes; what admission decided stays
// as the store has it (store.PutNodeSandbox).
func (s *Server) nodeSandbox(ctx context.Context, node string, req *nodeproto.SandboxRequest) (*struct{}, error) {
	if req.Sandbox == nil {
		return nil, errdefs.Invalid("sandbox", "a request records a sandbox")
	}
	if err := ownSandbox(node, "sandbox", req.Sandbox.ID); err != nil {
		return nil, err
	}
	return nil, s.store.PutNodeSandbox(ctx, node, req.Epoch, req.Sandbox)
}

// nodeGetSandbox reads the stored record of one of the caller's node's sandboxes (one that
// ended, which the edge keeps no copy of). Another node's is refused: an edge reads no record
// but its own node's.
func (s *Server) nodeGetSandbox(ctx context.Context, node string, req *nodeproto.GetSandboxRequest) (*store.Sandbox, error) {
	if err := ownSandbox(node, "id", req.ID); err != nil {
		return nil, err
	}
	sb, err := s.store.GetSandbox(ctx, req.ID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, clientRefusal{err}
	}
	return sb, err
}

// nodeSteps writes steps of the trajectories of the caller's sandboxes. A write to another
// node's sandbox refuses the batch; a fenced incarnation's is refused as a stale epoch.
func (s *Server) nodeSteps(ctx context.Context, node string, req *nodeproto.StepsRequest) (*nodeproto.StepsResponse, error) {
	if err := checkSteps(node, req); err != nil {
		return nil, err
	}
	res, err := s.store.NodeSteps(ctx, node, req.Epoch, req.Writes)
	if err != nil {
		return nil, err
	}
	return &nodeproto.StepsResponse{Steps: res}, nil
}

// checkSteps refuses a batch that is too large, malformed, or writes another node's sandbox's
// trajectory.
func checkSteps(node string, req *nodeproto.StepsRequest) error {
	if len(req.Writes) == 0 || len(req.Writes) > nodeproto.MaxSteps {
		return errdefs.Invalid("writes", "%d writes: 1 to %d a batch", len(req.Writes), nodeproto.MaxSteps)
	}
	for i, wr := range req.Writes {
		switch {
		case edge.NodeOf(wr.Sandbox) != node:
			return ownSandbox(node, fmt.Sprintf("writes[%d]", i), wr.Sandbox)
		case wr.Entry == nil:
			return errdefs.Invalid(fmt.Sprintf("writes[%d].entry", i), "a write has an entry")
		case wr.Update && wr.Entry.Seq <= 0:
			return errdefs.Invalid(fmt.Sprintf("writes[%d].entry.seq", i), "%d: an update names the step it rewrites", wr.Entry.Seq)
		}
	}
	return nil
}

// nodeVolume reads a volume one of the caller's sandboxes has attached.
func (s *Server) nodeVolume(ctx context.Context, node string, req *nodeproto.VolumeRequest) (*nodeproto.VolumeResponse, error) {
	if err := ownSandbox(node, "sandbox", req.Sandbox); err != nil {
		return nil, err
	}
	v, err := s.store.NodeVolume(ctx, node, req.Sandbox, req.Volume)
	if err != nil {
		return nil, err
	}
	return &nodeproto.VolumeResponse{SizeBytes: v.SizeBytes, Version: v.Version, Digest: v.Digest}, nil
}

// nodeVolumeCommit records a version of a volume the caller's sandbox wrote as its writer.
func (s *Server) nodeVolumeCommit(ctx context.Context, node string, req *nodeproto.VolumeRequest) (*struct{}, error) {
	if err := ownSandbox(node, "sandbox", req.Sandbox); err != nil {
		return nil, err
	}
	if req.Version < 1 || !volumeDigestRE.MatchString(req.Digest) {
		return nil, errdefs.Invalid("version", "version %d, digest %q: a commit names a version from 1 and its image's SHA-256 (64 hex digits)", req.Version, req.Digest)
	}
	return nil, s.store.CommitNodeVolume(ctx, node, req.Epoch, req.Sandbox, req.Volume, req.Version, req.Digest)
}

// volumeDigestRE matches a volume image's digest: its SHA-256 in hex.
var volumeDigestRE = lazyregexp.New(`^[0-9a-f]{64}$`)

// nodeVolumeCopy records that the caller's node holds a version of a volume one of its
// sandboxes has attached.
func (s *Server) nodeVolumeCopy(ctx context.Context, node string, req *nodeproto.VolumeRequest) (*struct{}, error) {
	if err := ownSandbox(node, "sandbox", req.Sandbox); err != nil {
		return nil, err
	}
	if req.Version < 0 {
		return nil, errdefs.Invalid("version", "%d: a copy is of a version from 0", req.Version)
	}
	return nil, s.store.SetNodeVolumeCopy(ctx, node, req.Epoch, req.Sandbox, req.Volume, req.Version)
}

// nodeVolumeVersions answers which of the volumes asked about still exist, and their versions.
func (s *Server) nodeVolumeVersions(ctx context.Context, _ string, req *nodeproto.VolumeVersionsRequest) (*nodeproto.VolumeVersionsResponse, error) {
	v, err := s.store.VolumeVersions(ctx, req.IDs)
	if err != nil {
		return nil, err
	}
	return &nodeproto.VolumeVersionsResponse{Versions: v}, nil
}

// nodeDigestsInUse answers which of the layer blobs asked about are in use, for an edge's GC.
func (s *Server) nodeDigestsInUse(ctx context.Context, _ string, req *nodeproto.DigestsInUseRequest) (*nodeproto.DigestsInUseResponse, error) {
	if len(req.Digests) > nodeproto.MaxDigests {
		return nil, errdefs.Invalid("digests", "%d digests: at most %d a call", len(req.Digests), nodeproto.MaxDigests)
	}
	used, err := s.store.DigestsInUse(ctx, req.Digests)
	if err != nil {
		return nil, err
	}
	return &nodeproto.DigestsInUseResponse{InUse: slices.Sorted(maps.Keys(used))}, nil
}

// nodeAdmit admits new sandboxes of the caller's node: one, with its create's idempotency key
// when it has one, or a fork's copies. A quota's refusal and an idempotent replay are answers,
// not errors, so the edge gets them back as the store's typed errors.
func (s *Server) nodeAdmit(ctx context.Context, node string, req *nodeproto.AdmitRequest) (*nodeproto.AdmitResponse, error) {
	n := len(req.Sandboxes)
	switch {
	case n == 0 || n > model.MaxForkCount:
		return nil, errdefs.Invalid("sandboxes", "%d records: an admission is of 1 to %d", n, model.MaxForkCount)
	case n > 1 && req.Key != nil:
		return nil, errdefs.Invalid("key", "an idempotency key is for the admission of one sandbox")
	}
	for i, sb := range req.Sandboxes {
		if sb == nil {
			return nil, errdefs.Invalid(fmt.Sprintf("sandboxes[%d]", i), "a record is needed")
		}
		if err := ownSandbox(node, fmt.Sprintf("sandboxes[%d].id", i), sb.ID); err != nil {
			return nil, err
		}
	}
	if req.Key != nil {
		if err := checkKey(req.Key); err != nil {
			return nil, err
		}
	}
	if err := s.admissible(ctx, node, req); err != nil {
		return nil, err
	}
	var err error
	if n == 1 {
		err = s.store.AdmitNodeSandbox(ctx, node, req.Epoch, req.Sandboxes[0], req.Key)
	} else {
		err = s.store.AdmitNodeSandboxes(ctx, node, req.Epoch, req.Sandboxes)
	}
	if qe, ok := errors.AsType[*iam.QuotaError](err); ok {
		return &nodeproto.AdmitResponse{Quota: &qe.QuotaExceeded}, nil
	}
	if re, ok := errors.AsType[*store.ReplayError](err); ok {
		rec, err := s.replayed(ctx, node, req.Voucher, req.Key, re.SandboxID)
		if err != nil {
			return nil, err
		}
		return &nodeproto.AdmitResponse{ReplayOf: re.SandboxID, Replay: rec}, nil
	}
	if err != nil {
		return nil, err
	}
	return &nodeproto.AdmitResponse{}, nil
}

// admissible checks that the caller's node may admit req's records: for a caller the servers
// sealed for it (req.Voucher) that may create sandboxes in the records' project, or, without
// one, as the containers of an fncall environment's pool (tier fncall, in the project of an
// fncall environment), which the edge starts on its own. A stolen edge therefore admits
// nothing for a project no recent caller of its own may create in.
func (s *Server) admissible(ctx context.Context, node string, req *nodeproto.AdmitRequest) error {
	project := req.Sandboxes[0].ProjectID
	if project == "" {
		project = store.RootProjectID
	}
	for i, sb := range req.Sandboxes {
		if p := cmp.Or(sb.ProjectID, store.RootProjectID); p != project {
			return errdefs.Invalid(fmt.Sprintf("sandboxes[%d].project_id", i), "the records of one admission are of one project")
		}
	}
	if req.Voucher == nil {
		for i, sb := range req.Sandboxes {
			if sb.Tier != edge.TierFncall {
				return fmt.Errorf("sandboxes[%d]: a %s sandbox is admitted for the caller of the request that makes it, and the edge sent none: %w", i, sb.Tier, errdefs.ErrDenied)
			}
		}
		ok, err := s.fncallProject(ctx, project)
		switch {
		case err != nil:
			return err
		case !ok:
			return fmt.Errorf("fncall containers of project %s, which has no fncall environment: %w", project, errdefs.ErrDenied)
		}
		return nil
	}
	c, err := s.sealer.Open(req.Voucher, node, time.Now())
	if err != nil {
		return err
	}
	path, err := s.store.ProjectPath(ctx, project)
	if err != nil {
		return err
	}
	return apiserver.CallerMay(c, iam.SandboxCreate, path)
}

// checkKey checks a create's idempotency key as an edge sends it.
func checkKey(key *store.Idempotency) error {
	switch {
	case key == nil:
		return errdefs.Invalid("key", "an idempotency key is needed")
	case key.Principal == "" || key.Key == "" || key.RequestHash == "":
		return errdefs.Invalid("key", "an idempotency key names its principal, its key and its request's hash")
	}
	return nil
}

// nodeIdempotency answers whether a create's idempotency key made a sandbox already.
func (s *Server) nodeIdempotency(ctx context.Context, node string, req *nodeproto.IdempotencyRequest) (*nodeproto.IdempotencyResponse, error) {
	if err := checkKey(req.Key); err != nil {
		return nil, err
	}
	err := s.store.CheckIdempotency(ctx, req.Key)
	if re, ok := errors.AsType[*store.ReplayError](err); ok {
		rec, err := s.replayed(ctx, node, req.Voucher, req.Key, re.SandboxID)
		if err != nil {
			return nil, err
		}
		return &nodeproto.IdempotencyResponse{ReplayOf: re.SandboxID, Replay: rec}, nil
	}
	if err != nil {
		return nil, err
	}
	return &nodeproto.IdempotencyResponse{}, nil
}

// replayed returns the record of sandbox id, which key's create made, when it is another node's
// than the caller's (whose record the edge does not hold) and the caller's voucher is of key's
// principal, sealed for the caller's node; nil otherwise (the edge holds its own node's records,
// and a key is no credential: without the create's caller the answer names the sandbox only).
func (s *Server) replayed(ctx context.Context, node string, v *nodeproto.Voucher, key *store.Idempotency, id string) (*store.Sandbox, error) {
	if v == nil || key == nil || edge.NodeOf(id) == node {
		return nil, nil
	}
	c, err := s.sealer.Open(v, node, time.Now())
	if err != nil || c.Principal != key.Principal {
		return nil, nil
	}
	rec, err := s.store.GetSandbox(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, nil // forgotten since: the edge answers what it finds
	}
	return rec, err
}

// nodeReleaseKey forgets a create's idempotency key that still names one of the caller's
// sandboxes, whose create never answered.
func (s *Server) nodeReleaseKey(ctx context.Context, node string, req *nodeproto.IdempotencyRequest) (*struct{}, error) {
	if err := checkKey(req.Key); err != nil {
		return nil, err
	}
	if err := ownSandbox(node, "sandbox", req.Sandbox); err != nil {
		return nil, err
	}
	return nil, s.store.ReleaseIdempotency(ctx, req.Key, req.Sandbox)
}

// nodeListSteps reads a page of the trajectory of one of the caller's sandboxes.
func (s *Server) nodeListSteps(ctx context.Context, node string, req *nodeproto.ListStepsRequest) (*nodeproto.ListStepsResponse, error) {
	if err := ownSandbox(node, "sandbox", req.Sandbox); err != nil {
		return nil, err
	}
	if req.Limit < 1 || req.Limit > nodeproto.MaxListSteps || req.After < 0 {
		return nil, errdefs.Invalid("limit", "a page is 1 to %d steps after step 0 or later, not %d after %d", nodeproto.MaxListSteps, req.Limit, req.After)
	}
	steps, err := s.store.ListSteps(ctx, req.Sandbox, req.After, req.Limit, req.State)
	if err != nil {
		return nil, err
	}
	return &nodeproto.ListStepsResponse{Steps: steps}, nil
}

// checkEvents refuses a batch that is too large or speaks for another node.
func checkEvents(node string, req *nodeproto.EventsRequest) error {
	if len(req.Events) > nodeproto.MaxEvents {
		return errdefs.Invalid("events", "%d events: at most %d a batch", len(req.Events), nodeproto.MaxEvents)
	}
	prefix := "ev-" + node + "-"
	for i, ev := range req.Events {
		switch {
		case ev.Node != node:
			return fmt.Errorf("events[%d] names node %q; node %s records its own events only: %w", i, ev.Node, node, errdefs.ErrDenied)
		case !strings.HasPrefix(ev.ID, prefix) || len(ev.ID) > 128:
			return errdefs.Invalid(fmt.Sprintf("events[%d].id", i), "%q: node %s's event IDs start with %s", ev.ID, node, prefix)
		case ev.Sandbox != "" && edge.NodeOf(ev.Sandbox) != node:
			return ownSandbox(node, fmt.Sprintf("events[%d].sandbox", i), ev.Sandbox)
		case ev.At.IsZero() || !slices.Contains(events.Types, ev.Type):
			return errdefs.Invalid(fmt.Sprintf("events[%d]", i), "an event has a time and one of the event types, not %q", ev.Type)
		case ev.Type == events.NodeState:
			return fmt.Errorf("events[%d]: a node's state changes are the servers' to record: %w", i, errdefs.ErrDenied)
		}
	}
	return nil
}

// serveNodes serves the node channel on lis; its end goes to errc.
func (s *Server) serveNodes(lis net.Listener, errc chan<- error) *http.Server {
	srv := &http.Server{Handler: s.nodeHandler(), TLSConfig: s.nodeTLS, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
	go func() {
		if err := srv.ServeTLS(lis, "", ""); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("node channel: %w", err)
		}
	}()
	return srv
}

// nodeURLs are the node channel's URLs for an edge that joined through r: this replica's first
// (NodeURL, else the host r reached it at with the node channel's port), then the other replicas
// alive.
func (s *Server) nodeURLs(r *http.Request) []string {
	if s.nodePort == 0 {
		return nil // not serving it (a test's replica)
	}
	own := s.cfg.NodeURL
	if own == "" {
		host := r.Host
		if h, _, err := net.SplitHostPort(r.Host); err == nil {
			host = h
		}
		if host != "" {
			own = "https://" + net.JoinHostPort(host, strconv.Itoa(s.nodePort))
		}
	}
	var urls []string
	if own != "" {
		urls = append(urls, own)
	}
	for _, u := range s.replicaURLs(r.Context()) {
		if !slices.Contains(urls, u) {
			urls = append(urls, u)
		}
	}
	return urls
}

// advertised is the node channel URL this replica announces to the others: NodeURL, else the
// node listener's address when it names one host; "" when it names none (0.0.0.0): edges then
// learn it only when they join through it.
func (s *Server) advertised() string {
	if s.cfg.NodeURL != "" {
		return s.cfg.NodeURL
	}
	host, _, err := net.SplitHostPort(s.cfg.NodeListen)
	if err != nil || host == "" {
		return ""
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return ""
	}
	return "https://" + net.JoinHostPort(host, strconv.Itoa(s.nodePort))
}

// Replica announcements: every announceEvery a replica records that it is alive (store.
// AnnounceServer); one not seen for replicaGone is left out of what edges learn.
const (
	announceEvery = 5 * time.Second
	replicaGone   = 30 * time.Second
)

// announce records this replica every announceEvery until ctx ends, and forgets it then.
func (s *Server) announce(ctx context.Context) {
	url := s.advertised()
	t := time.NewTicker(announceEvery)
	defer t.Stop()
	for {
		if err := s.store.AnnounceServer(ctx, s.name, url); err != nil && ctx.Err() == nil {
			s.log.Warn("announce this replica to the edges", "err", err)
		}
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
			defer cancel()
			if err := s.store.ForgetServer(fctx, s.name, time.Now().Add(-time.Hour)); err != nil {
				s.log.Warn("forget this replica", "err", err)
			}
			return
		case <-t.C:
		}
	}
}

// replicaURLs returns the node channel URLs of the replicas alive, read at most every
// announceEvery. The read is made outside s.mu (which every call to an edge takes), under a lock
// of its own, so that heartbeats arriving together make one read.
func (s *Server) replicaURLs(ctx context.Context) []string {
	s.replicasMu.Lock()
	defer s.replicasMu.Unlock()
	if time.Since(s.replicasAt) < announceEvery {
		return s.replicas
	}
	urls, err := s.store.ServerURLs(ctx, time.Now().Add(-replicaGone))
	if err != nil {
		s.log.Warn("read the replicas", "err", err)
		return s.replicas
	}
	s.replicas, s.replicasAt = urls, time.Now()
	return urls
}

// nodeResolve resolves what a create of the caller's node names in the catalogue, for a caller
// that may create sandboxes in its project (resolvable), so that the edge reads no catalogue.
func (s *Server) nodeResolve(ctx context.Context, node string, req *nodeproto.ResolveRequest) (*catalog.Resolution, error) {
	if err := s.resolvable(ctx, node, req); err != nil {
		return nil, err
	}
	res, err := s.resolver.Resolve(ctx, req.Request, req.Calls)
	if errors.Is(err, errdefs.ErrInvalid) {
		return nil, clientRefusal{err}
	}
	return res, err
}

// resolvable checks that the caller's node may have req resolved: for a caller the servers
// sealed for it that may create sandboxes in the request's project, or, without one, for what
// an edge starts on its own: an fncall environment's pool containers (in that environment's
// project) and a warm environment's pooled sandboxes (naming it, in its project). A stolen edge
// therefore reads nothing of a project's catalogue that no recent caller of its own may create
// in.
func (s *Server) resolvable(ctx context.Context, node string, req *nodeproto.ResolveRequest) error {
	at, err := iam.ParsePath("project", req.Request.Project)
	if err != nil {
		return err
	}
	if req.Voucher != nil {
		c, err := s.sealer.Open(req.Voucher, node, time.Now())
		if err != nil {
			return err
		}
		return apiserver.CallerMay(c, iam.SandboxCreate, at)
	}
	inProject := func(project string) bool {
		p, err := iam.ParsePath("project", project)
		return err == nil && p == at
	}
	started, err := s.configHolds(ctx, func(cfg *nodeproto.ConfigResponse) bool {
		if req.Calls {
			return slices.ContainsFunc(cfg.FncallEnvs, func(e store.FncallEnvRecord) bool { return inProject(e.Project) })
		}
		return req.Request.Environment != "" && slices.ContainsFunc(cfg.WarmEnvironments, func(e model.Environment) bool {
			return e.Name == req.Request.Environment && inProject(e.Project)
		})
	})
	switch {
	case err != nil:
		return err
	case !started:
		return fmt.Errorf("a create in project %s is resolved for the caller of the request that makes it, and the edge sent none (it is neither an fncall environment's container nor a warm environment's): %w", iam.Display(at), errdefs.ErrDenied)
	}
	return nil
}

// configHolds reports whether the configuration the edges follow satisfies holds: the copy this
// replica has, or, when that does not and it is older than a quarter of configFresh, a fresh
// read (an environment saved within the last second; at most 4 reads a second, whatever the
// edges ask).
func (s *Server) configHolds(ctx context.Context, holds func(*nodeproto.ConfigResponse) bool) (bool, error) {
	cfg, err := s.nodeConfigNow(ctx, false)
	if err == nil && !holds(cfg) && s.configAge() > configFresh/4 {
		cfg, err = s.nodeConfigNow(ctx, true)
	}
	if err != nil {
		return false, err
	}
	return holds(cfg), nil
}

// fncallProject reports whether an fncall environment is in the project with this ID (the
// edges start containers and keep artifacts for those only).
func (s *Server) fncallProject(ctx context.Context, project string) (bool, error) {
	return s.configHolds(ctx, func(cfg *nodeproto.ConfigResponse) bool {
		return slices.ContainsFunc(cfg.FncallEnvs, func(e store.FncallEnvRecord) bool { return e.ProjectID == project })
	})
}
