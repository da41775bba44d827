package nodeproto

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

// The node channel: what an edge asks of the cluster's servers, over mutual TLS to the servers'
// node listener (clusterauth.NodeChannelTLS and EdgeClientTLS). The server takes the node from
// the edge's certificate, never from a body, and checks every call's epoch against the node's
// row in the same transaction as what it writes, so an edge can act only as the incarnation of
// its own node that holds the lease.
//
// Each call is a POST of a JSON body that speaks Version (HeaderVersion); errors are the API's
// JSON {code, message} with HeaderRefusal set to StaleEpoch when the edge's incarnation was
// fenced off.

// The node channel's paths.
const (
	PathRegister       = "/node/v1/register"
	PathHeartbeat      = "/node/v1/heartbeat"
	PathEvents         = "/node/v1/events"
	PathActivity       = "/node/v1/activity"
	PathConfig         = "/node/v1/config"
	PathArtifactLimits = "/node/v1/artifact-limits"
	PathSandbox        = "/node/v1/sandbox"
	PathSteps          = "/node/v1/steps"
	PathListSteps      = "/node/v1/steps/list"
	PathVolume         = "/node/v1/volume"
	PathVolumeCommit   = "/node/v1/volume/commit"
	PathVolumeCopy     = "/node/v1/volume/copy"
	PathVolumeVersions = "/node/v1/volumes/versions"
	PathDigestsInUse   = "/node/v1/layers/in-use"
	PathAdmit          = "/node/v1/admit"
	PathIdempotency    = "/node/v1/idempotency"
	PathReleaseKey     = "/node/v1/idempotency/release"
	PathResolve        = "/node/v1/resolve"
	PathPublishLayer   = "/node/v1/layers/publish"
	PathSetLayer       = "/node/v1/layers/set"
	PathDeleteLayer    = "/node/v1/layers/delete"
	PathEnvironment    = "/node/v1/environment"
	PathAudit          = "/node/v1/audit"
	PathCatalogRead    = "/node/v1/catalog/read"
	PathGetSandbox     = "/node/v1/sandbox/get"
)

// Lease TTL bounds: what an edge may ask for its lease. Below the minimum a heartbeat every third
// of it loads the servers for nothing; above the maximum a dead node keeps its sandboxes' quota
// and a server starting after an outage of every server waits too long before declaring any node
// lost (it waits MaxLeaseTTL first).
const (
	MinLeaseTTL = 3 * time.Second
	MaxLeaseTTL = 5 * time.Minute
)

// MaxEvents bounds one events batch (an edge's bus writes at most its queue, 4096 by
// default, in batches of what piled up in 100 ms), and MaxActivity one activity batch (an edge
// runs at most --max-sandboxes, 1000 by default); a client sends larger ones in pieces.
const (
	MaxEvents   = 4096
	MaxActivity = 4096
)

// MaxSteps bounds the trajectory writes of one steps request (an edge writes at most that many
// queued steps at a time), MaxStepsBody its body: each step keeps at most 256 KiB of output,
// which JSON's base64 makes a third larger. MaxListSteps bounds a page of a trajectory.
const (
	MaxSteps     = 64
	MaxStepsBody = 64 << 20
	MaxListSteps = 1000
)

// maxBody bounds a node channel request; maxAnswer an answer (a registration's carries the
// records of every sandbox the node may still run: --max-sandboxes of them).
const (
	maxBody   = 8 << 20
	maxAnswer = 64 << 20
)

// RegisterRequest starts a new incarnation of the caller's node: where the servers reach its
// API, what it offers and speaks, and how long a heartbeat holds its lease.
type RegisterRequest struct {
	URL      string            `json:"url"`
	Capacity store.Resources   `json:"capacity"`
	Labels   map[string]string `json:"labels,omitempty"`
	Tiers    []string          `json:"tiers,omitempty"`
	Runtimes []string          `json:"runtimes,omitempty"`
	// Protocol is the node protocol the edge's API speaks (Version).
	Protocol int `json:"protocol"`
	// LeaseTTLMillis is the lease's length, within [MinLeaseTTL, MaxLeaseTTL].
	LeaseTTLMillis int64 `json:"lease_ttl_ms"`
}

// RegisterResponse is the node's row with its new epoch, and what the edge starts from: its
// instance name (store.Instance: it names the node's layer versions in the shared catalogue) and
// the records of its sandboxes that may still run (live, or being deleted), read after the new
// incarnation fenced off every older one, so nothing but this edge changes them from then on.
type RegisterResponse struct {
	store.Node
	Instance  string           `json:"instance"`
	Sandboxes []*store.Sandbox `json:"sandboxes"`
	// Features names what of the channel the replica serves beyond the registration's release
	// (FeatureVolumes); a replica of an older release, during a rolling upgrade, names fewer,
	// and the edge keeps doing the rest in the store.
	Features []string `json:"features,omitempty"`
}

// The features a replica names in RegisterResponse.Features.
const (
	// FeatureVolumes: PathVolume, PathVolumeCommit, PathVolumeCopy and PathVolumeVersions.
	FeatureVolumes = "volumes"
	// FeatureDigests: PathDigestsInUse.
	FeatureDigests = "digests"
	// FeatureAdmission: PathAdmit, PathIdempotency and PathReleaseKey.
	FeatureAdmission = "admission"
	// FeatureResolve: PathResolve.
	FeatureResolve = "resolve"
	// FeaturePublish: PathPublishLayer, PathSetLayer, PathDeleteLayer and PathEnvironment.
	FeaturePublish = "publish"
	// FeatureAudit: PathAudit.
	FeatureAudit = "audit"
	// FeatureCatalogRead: PathCatalogRead.
	FeatureCatalogRead = "catalog-read"
	// FeatureGetSandbox: PathGetSandbox.
	FeatureGetSandbox = "sandbox-get"
)

// Features lists what this build's replicas serve.
var Features = []string{FeatureVolumes, FeatureDigests, FeatureAdmission, FeatureResolve, FeaturePublish, FeatureAudit, FeatureCatalogRead, FeatureGetSandbox}

// HeartbeatRequest renews the lease of the caller's incarnation Epoch. The server counts what
// the node's live sandboxes use from their records: the edge reports nothing admission acts on.
// Warm are its warm pools' figures by environment, which the servers keep until the next
// heartbeat and show with the environment (at most MaxWarmFigures; shown, never acted on).
type HeartbeatRequest struct {
	Epoch          int64                        `json:"epoch"`
	LeaseTTLMillis int64                        `json:"lease_ttl_ms"`
	Warm           map[string]store.WarmFigures `json:"warm,omitempty"`
}

// MaxWarmFigures bounds the environments one heartbeat reports warm pools of.
const MaxWarmFigures = 4096

// HeartbeatResponse is the node's state (an operator may have cordoned or drained it), and the
// node channel URLs of the replicas alive now, which the edge calls from then on.
type HeartbeatResponse struct {
	State   string   `json:"state"`
	Servers []string `json:"servers,omitempty"`
	// Config is the Generation of the configuration the edge follows (ConfigResponse): when it
	// is not the one the edge holds, the edge fetches it.
	Config string `json:"config,omitempty"`
}

// ConfigRequest asks for the configuration an edge follows. Fresh skips the replica's copy of
// the last second (an edge asks so after it changed something itself).
type ConfigRequest struct {
	Fresh bool `json:"fresh,omitempty"`
}

// ArtifactLimitsRequest asks the limits on the artifacts of the project with this ID, which an
// fncall environment is in (store.ArtifactLimits).
type ArtifactLimitsRequest struct {
	Project string `json:"project"`
}

// ArtifactLimitsResponse is the project's own limit and each of its ancestors' that sets one.
type ArtifactLimitsResponse struct {
	Limits []store.ArtifactLimit `json:"limits"`
}

// ConfigResponse is what an edge follows of what is configured through the API, which it keeps
// nowhere else: the environments to keep warm, the fncall environments, and the service catalog
// saved through the API. The limits on the fncall environments' artifacts are not in it
// (ArtifactLimitsRequest): each names every project of its subtree, which would change the
// document with every project made under it.
type ConfigResponse struct {
	// Generation names this content (a digest of it): heartbeats answer the current one.
	Generation       string                  `json:"generation"`
	WarmEnvironments []model.Environment     `json:"warm_environments"`
	FncallEnvs       []store.FncallEnvRecord `json:"fncall_environments"`
	// ServiceCatalog is the catalog saved through the API (PUT /v1/network/services); absent
	// when none was.
	ServiceCatalog json.RawMessage `json:"service_catalog,omitempty"`
}

// EventsRequest records a batch of the caller's events. Each must name the caller's node, and a
// sandbox event a sandbox of that node.
type EventsRequest struct {
	Epoch  int64          `json:"epoch"`
	Events []events.Event `json:"events"`
}

// ActivityRequest records what live sandboxes of the caller's node did: their last activity,
// usage counters and first exec (store.Activity). Sandboxes of other nodes refuse the batch.
type ActivityRequest struct {
	Epoch     int64            `json:"epoch"`
	Sandboxes []store.Activity `json:"sandboxes"`
}

// SandboxRequest records what became of one of the caller's sandboxes (its state, stop intent,
// expiry, pause, power, network policy and slot): store.PutNodeSandbox, which keeps what
// admission decided (project, tier, limits) as the store has it.
type SandboxRequest struct {
	Epoch   int64          `json:"epoch"`
	Sandbox *store.Sandbox `json:"sandbox"`
}

// GetSandboxRequest reads the record of one of the caller's node's sandboxes as the store has it
// (PathGetSandbox): one the edge no longer keeps a copy of, since it ended.
type GetSandboxRequest struct {
	ID string `json:"id"`
}

// StepsRequest writes steps of the trajectories of the caller's sandboxes, in order and all or
// none (store.NodeSteps).
type StepsRequest struct {
	Epoch  int64             `json:"epoch"`
	Writes []store.StepWrite `json:"writes"`
}

// StepsResponse is what each write did, in the request's order.
type StepsResponse struct {
	Steps []store.StepResult `json:"steps"`
}

// ListStepsRequest reads up to Limit steps of a sandbox's trajectory after step After (only
// those in State, when set).
type ListStepsRequest struct {
	Sandbox string `json:"sandbox"`
	After   int64  `json:"after"`
	Limit   int    `json:"limit"`
	State   string `json:"state,omitempty"`
}

// VolumeRequest acts on volume Volume for the caller's sandbox Sandbox, which has it attached:
// reads its current version (PathVolume), commits Version with Digest as written by Sandbox,
// its writer (PathVolumeCommit), or records that the node holds Version (PathVolumeCopy).
type VolumeRequest struct {
	Epoch   int64  `json:"epoch"`
	Sandbox string `json:"sandbox"`
	Volume  string `json:"volume"`
	Version int64  `json:"version,omitempty"`
	Digest  string `json:"digest,omitempty"`
}

// VolumeResponse is a volume as a node's sandbox sees it: its size and its current version
// (0: never written) with that image's digest.
type VolumeResponse struct {
	SizeBytes int64  `json:"size_bytes"`
	Version   int64  `json:"version"`
	Digest    string `json:"digest,omitempty"`
}

// VolumeVersionsRequest asks which of these volumes (at most store.MaxVolumeVersions) still
// exist, and at which version.
type VolumeVersionsRequest struct {
	IDs []string `json:"ids"`
}

// VolumeVersionsResponse maps each volume asked about that exists to its current version.
type VolumeVersionsResponse struct {
	Versions map[string]int64 `json:"versions"`
}

// MaxDigests bounds the digests of one DigestsInUseRequest.
const MaxDigests = 1000

// DigestsInUseRequest asks which of these layer blobs (at most MaxDigests) a published
// version names or a live sandbox of any node has in its rootfs (store.DigestsInUse): those
// an edge's layer GC keeps.
type DigestsInUseRequest struct {
	Digests []string `json:"digests"`
}

// DigestsInUseResponse lists the digests asked about that are in use.
type DigestsInUseResponse struct {
	InUse []string `json:"in_use"`
}

// ListStepsResponse is a page of a trajectory, in order.
type ListStepsResponse struct {
	Steps []model.TrajectoryEntry `json:"steps"`
}

// LeaseTTL checks an edge's requested lease length.
func LeaseTTL(ms int64) (time.Duration, error) {
	d := time.Duration(ms) * time.Millisecond
	if d < MinLeaseTTL || d > MaxLeaseTTL {
		return 0, errdefs.Invalid("lease_ttl_ms", "%d: a lease is %v to %v", ms, MinLeaseTTL, MaxLeaseTTL)
	}
	return d, nil
}

// tryTimeout bounds one try at one replica: with the default lease (15 s, a heartbeat every 5 s)
// a heartbeat that finds two replicas unreachable still reaches a third within the lease.
// stepsTimeout bounds a try of a trajectory batch, which may carry MaxStepsBody.
const (
	tryTimeout   = 5 * time.Second
	stepsTimeout = 30 * time.Second
)

// MaxServers bounds the replicas' URLs an edge keeps.
const MaxServers = 64

// Servers is an edge's client of the servers' node channel. It calls one replica until that one
// cannot be reached, then the next it knows of; every heartbeat's answer tells it the replicas
// alive. Its methods may be called concurrently.
type Servers struct {
	client *http.Client

	mu   sync.Mutex
	urls []string // the replicas' node channel URLs, the one called now first
}

// NewServers returns a client of the node channel at urls (https://HOST:PORT each: the replicas',
// or one service address for all) that dials with tlsCfg (clusterauth.EdgeClientTLS).
func NewServers(urls []string, tlsCfg *tls.Config) (*Servers, error) {
	urls, err := checkURLs(urls)
	if err != nil {
		return nil, err
	}
	if len(urls) == 0 {
		return nil, errdefs.Invalid("node_url", "no URL of the node channel")
	}
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
		TLSClientConfig:     tlsCfg,
		TLSHandshakeTimeout: 5 * time.Second,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 4,
		// A dead replica behind the service address is noticed within seconds and the next
		// call dials again (possibly another replica).
		HTTP2: &http.HTTP2Config{SendPingTimeout: 5 * time.Second, PingTimeout: 5 * time.Second},
	}
	// Each try's time is bounded by its context (tryTimeout, stepsTimeout), not the client.
	return &Servers{urls: urls, client: &http.Client{Transport: tr}}, nil
}

// checkURLs returns urls without trailing slashes or repeats, or why one is not a node channel's.
func checkURLs(urls []string) ([]string, error) {
	var out []string
	for _, u := range urls {
		if !strings.HasPrefix(u, "https://") || len(u) > 512 {
			return nil, errdefs.Invalid("node_url", "%q: the node channel is https://HOST:PORT (mutual TLS under the cluster CA)", u)
		}
		if u = strings.TrimRight(u, "/"); !slices.Contains(out, u) && len(out) < MaxServers {
			out = append(out, u)
		}
	}
	return out, nil
}

// URLs returns the replicas the client knows, the one it calls now first.
func (s *Servers) URLs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.urls)
}

// learn takes the replicas a heartbeat named, after the one called now, which just answered
// (it may not be among them: a replica listening on every address announces no URL of its own).
// Replicas neither named nor called now are dropped.
func (s *Servers) learn(named []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	urls, err := checkURLs(append([]string{s.urls[0]}, named...))
	if err != nil {
		return // a server's answer this build cannot use: keep what it knows
	}
	s.urls = urls
}

// failed moves url, which could not be reached, behind the others.
func (s *Servers) failed(url string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.urls) > 1 && s.urls[0] == url {
		s.urls = append(s.urls[1:], url)
	}
}

// Register starts a new incarnation of the edge's node (named by its certificate) and returns
// the node's row, with its new epoch, and what the edge starts from.
func (s *Servers) Register(ctx context.Context, req RegisterRequest) (*RegisterResponse, error) {
	var out RegisterResponse
	if err := s.call(ctx, PathRegister, req, &out); err != nil {
		return nil, fmt.Errorf("register with the servers: %w", err)
	}
	return &out, nil
}

// Heartbeat renews the lease of incarnation epoch for ttl and returns the node's state and the
// configuration's generation. It fails with store.ErrFenced when the incarnation was fenced off
// (a newer one registered, or the node was declared lost).
func (s *Servers) Heartbeat(ctx context.Context, epoch int64, ttl time.Duration, warm map[string]store.WarmFigures) (HeartbeatResponse, error) {
	var out HeartbeatResponse
	if err := s.call(ctx, PathHeartbeat, HeartbeatRequest{Epoch: epoch, LeaseTTLMillis: ttl.Milliseconds(), Warm: warm}, &out); err != nil {
		return out, fmt.Errorf("heartbeat (epoch %d): %w", epoch, err)
	}
	s.learn(out.Servers)
	return out, nil
}

// EventRecorder returns the events.Recorder of incarnation epoch: its batches go to the servers
// (PathEvents), in pieces of at most MaxEvents.
func (s *Servers) EventRecorder(epoch int64) events.Recorder {
	return eventRecorder{s, epoch}
}

// ActivityRecorder returns what records the live sandboxes' activity of incarnation epoch: its
// batches go to the servers, in pieces of at most MaxActivity.
func (s *Servers) ActivityRecorder(epoch int64) ActivityRecorder {
	return ActivityRecorder{s, epoch}
}

// ActivityRecorder sends an incarnation's activity batches to the servers.
type ActivityRecorder struct {
	s     *Servers
	epoch int64
}

// RecordActivity sends acts to the servers.
func (r ActivityRecorder) RecordActivity(ctx context.Context, acts []store.Activity) error {
	for len(acts) > 0 {
		n := min(len(acts), MaxActivity)
		if err := r.s.call(ctx, PathActivity, ActivityRequest{Epoch: r.epoch, Sandboxes: acts[:n]}, nil); err != nil {
			return fmt.Errorf("send the activity of %d sandboxes to the servers: %w", n, err)
		}
		acts = acts[n:]
	}
	return nil
}

type eventRecorder struct {
	s     *Servers
	epoch int64
}

// AddEvents sends evs to the servers.
func (r eventRecorder) AddEvents(ctx context.Context, evs []events.Event) error {
	for len(evs) > 0 {
		n := min(len(evs), MaxEvents)
		if err := r.s.call(ctx, PathEvents, EventsRequest{Epoch: r.epoch, Events: evs[:n]}, nil); err != nil {
			return fmt.Errorf("send %d events to the servers: %w", n, err)
		}
		evs = evs[n:]
	}
	return nil
}

// call POSTs in to path and decodes the answer into out (unless nil). A replica that cannot be
// reached is put last and the next one tried, each at most once: every call is safe to repeat
// (a registration that reached a replica whose answer was lost only fences an incarnation that
// never ran; events are recorded once by their IDs; activity moves counters and times forward
// only; a step with an ID whose first answer broke off is found and taken as the edge's own,
// Steps.BeginStep), but for the append of a step without an ID whose answer broke off after it
// was written: the trajectory then shows that step twice.
func (s *Servers) call(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	var errs []error
	for _, url := range s.URLs() {
		err := s.callOne(ctx, url, path, body, out)
		if !errors.Is(err, errUnreachable) {
			return err
		}
		s.failed(url)
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("no replica's node channel answered: %w: %w", errors.Join(errs...), errdefs.ErrUnavailable)
}

// errUnreachable marks a replica that could not be reached, whose answer broke off, or that
// answered it is unavailable (its store, or another version during a rolling upgrade): another
// replica may do better.
var errUnreachable = errors.New("unreachable")

// callOne is one try of call, at the replica at url.
func (s *Servers) callOne(ctx context.Context, url, path string, body []byte, out any) error {
	limit := tryTimeout
	if path == PathSteps {
		limit = stepsTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderVersion, strconv.Itoa(Version))
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %v: %w", url, err, errUnreachable)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err == nil && len(raw) > maxAnswer {
		return fmt.Errorf("%s: an answer over %d bytes", url, maxAnswer)
	}
	if err != nil {
		return fmt.Errorf("%s: read the answer: %v: %w", url, err, errUnreachable)
	}
	switch {
	case Refused(resp.Header) == StaleEpoch:
		// The node's state, not the replica's: every replica would answer the same.
		return answerError(resp, raw)
	case resp.StatusCode == http.StatusBadGateway || resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusGatewayTimeout:
		return fmt.Errorf("%s: %w: %w", url, answerError(resp, raw), errUnreachable)
	case resp.StatusCode == http.StatusNotFound && !isAPIError(raw):
		// A path this replica does not serve (one of an older release, during a rolling
		// upgrade of the servers): another may.
		return fmt.Errorf("%s: %s is not served there: %w", url, path, errUnreachable)
	case resp.StatusCode/100 != 2:
		return answerError(resp, raw)
	case out == nil:
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("the servers' node channel %s: undecodable answer: %v", url, err)
	}
	return nil
}

// isAPIError reports whether raw is an error answer of the API's shape ({code, message}), not
// a router's plain 404.
func isAPIError(raw []byte) bool {
	var e struct {
		Code string `json:"code"`
	}
	return json.Unmarshal(raw, &e) == nil && e.Code != ""
}

// answerError turns an error answer into the error it says: store.ErrFenced for a StaleEpoch
// refusal, else the errdefs kind of its status with the server's message.
func answerError(resp *http.Response, raw []byte) error {
	var e struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Field   string `json:"field"`
	}
	msg := strings.TrimSpace(string(raw))
	if json.Unmarshal(raw, &e) == nil && e.Message != "" {
		msg = e.Message
	}
	switch Refused(resp.Header) {
	case StaleEpoch:
		return fmt.Errorf("%s: %w", msg, store.ErrFenced)
	case WrongVersion:
		return fmt.Errorf("%s: %w", msg, ErrVersion)
	}
	if rest, ok := strings.CutPrefix(msg, e.Field+": "); ok && e.Field != "" && resp.StatusCode == http.StatusBadRequest {
		// A request's field the servers refused: the same error as where it was made, so the
		// edge answers its client as `corral up` would.
		return errdefs.Invalid(e.Field, "%s", rest)
	}
	return fmt.Errorf("%s (%s): %w", msg, resp.Status, errdefs.KindOf(resp.StatusCode))
}
