package edge

import (
	"context"
	"time"

	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

// Settings is what the edge follows of what is configured through the API: the environments to
// keep warm, the fncall environments and the limits on their projects' artifacts, and the
// service catalog saved through the API. `corral up` reads them from its store (storeSettings);
// a cluster's edge from its copy of the servers' (nodeproto.Config), which it fetches when a
// heartbeat says they changed (Edge.SettingsChanged).
type Settings interface {
	WarmEnvironments(ctx context.Context) ([]model.Environment, error)
	ListFncallEnvs(ctx context.Context) ([]store.FncallEnvRecord, error)
	// ArtifactLimits returns the limits on the artifacts of the project with this ID.
	ArtifactLimits(ctx context.Context, project string) ([]store.ArtifactLimit, error)
	// ProjectPath returns the path (iam.Display) of the project with this ID, which an fncall
	// environment is in.
	ProjectPath(ctx context.Context, project string) (string, error)
	// ServiceCatalog returns the catalog saved through the API; ErrNotFound when none was.
	ServiceCatalog(ctx context.Context) ([]byte, error)
	// Refresh takes up a change the edge made itself (an environment, an fncall environment)
	// before the edge acts on it.
	Refresh(ctx context.Context) error
}

// Records records what becomes of the edge's sandboxes after their admission: the store under
// `corral up`, the servers on a cluster's edge (nodeproto.Records), which keep what admission
// decided (project, tier, limits) as they have it.
type Records interface {
	PutSandbox(ctx context.Context, sb *store.Sandbox) error
}

// RecordReader reads the stored record of one of the node's sandboxes that the edge keeps no
// copy of (it ended): the store under `corral up`, the servers on a cluster's edge
// (nodeproto.Records), which answer only the node's own.
type RecordReader interface {
	GetSandbox(ctx context.Context, id string) (*store.Sandbox, error)
}

// Admissions admits the edge's new sandboxes: the store under `corral up`, the servers on a
// cluster's edge (nodeproto.Admissions), which check the node's epoch, the quotas, the creation
// rate, the volumes and the idempotency key in one transaction. Its refusals are the store's
// typed errors (*iam.QuotaError, *store.ReplayError).
type Admissions interface {
	// AdmitSandbox records sb (state creating) with its create's key (nil: none).
	AdmitSandbox(ctx context.Context, sb *store.Sandbox, key *store.Idempotency) error
	// AdmitSandboxes records the copies of a fork, all or none.
	AdmitSandboxes(ctx context.Context, sbs []*store.Sandbox) error
	// CheckIdempotency answers a create before any work: a *store.ReplayError when key made
	// a sandbox already.
	CheckIdempotency(ctx context.Context, key *store.Idempotency) error
	// ReleaseIdempotency forgets key if it still names sandboxID (a create that never answered).
	ReleaseIdempotency(ctx context.Context, key *store.Idempotency, sandboxID string) error
}

// Catalog resolves what a create names in the catalogue (its project, environment, layers and
// volumes): the store under `corral up` (catalog.Resolver), the servers on a cluster's edge
// (nodeproto.Catalog), so that the edge reads no catalogue to create.
type Catalog interface {
	// Resolve resolves req (calls: a container of an fncall environment's pool).
	Resolve(ctx context.Context, req model.CreateRequest, calls bool) (*catalog.Resolution, error)
}

// CatalogReader reads the catalogue for the node's own jobs (a build's FROM, its steps' cached
// layers and the environment it saves; a snapshot's version and parent) and the requests it
// serves (an import's parts, the API's layer guards and reads), as project at (canonical) may
// use it: the store under `corral up` (catalog.Resolver), the servers on a
// cluster's edge (nodeproto.CatalogReader), which answer only for a caller they sealed for the
// node who may read layers in at. What at does not see is errdefs.ErrNotFound.
type CatalogReader interface {
	VisibleLayer(ctx context.Context, at, name, version string) (model.Layer, error)
	VisibleEnvironment(ctx context.Context, at, name string) (model.Environment, error)
	// EnvironmentOwner is the project owning environment name, and whether there is one.
	EnvironmentOwner(ctx context.Context, at, name string) (string, bool, error)
	// LayerVersions are the versions of layer name, and ReadableLayer is version name:version
	// (or a tag's), whichever project owns it (the servers: only what the caller can read; the
	// API checks its caller either way).
	LayerVersions(ctx context.Context, name string) ([]model.Layer, error)
	ReadableLayer(ctx context.Context, name, version string) (model.Layer, error)
}

// Publisher records the layer versions the edge makes (imports, snapshots, builds' steps) and
// changes them (fill rate, visibility, delete), and saves the environments builds make: the
// store under `corral up`, the servers on a cluster's edge (nodeproto.Publisher), which write
// only for a caller the servers sealed for the node who may publish in the layer's project.
// What is refused is the store's error (a version reused with other content is a conflict).
type Publisher interface {
	PublishLayer(ctx context.Context, l model.Layer) (model.Layer, bool, error)
	SetLayerFillRate(ctx context.Context, name, version string, rate int64) (model.Layer, error)
	SetLayerPublic(ctx context.Context, name, version string, public bool) (model.Layer, error)
	DeleteLayer(ctx context.Context, name, version string) (model.Layer, error)
	// ReplaceEnvironment saves env (checked), replacing the composition of an environment of
	// the same project: a build's result.
	ReplaceEnvironment(ctx context.Context, env model.Environment) (model.Environment, error)
}

// Trajectory records and reads the trajectories of the edge's sandboxes: the store under `corral
// up`, the servers on a cluster's edge (nodeproto.Steps).
type Trajectory interface {
	// BeginStep appends e, setting its sequence number; when e's step ID is a step's already,
	// nothing is written and that step is returned.
	BeginStep(ctx context.Context, sandbox string, e *model.TrajectoryEntry) (existing *model.TrajectoryEntry, err error)
	// UpdateStep rewrites step e.Seq.
	UpdateStep(ctx context.Context, sandbox string, e *model.TrajectoryEntry) error
	// WriteSteps applies writes (steps without IDs) in order, all or none, setting the
	// sequence number of each entry appended.
	WriteSteps(ctx context.Context, writes []store.StepWrite) error
	ListSteps(ctx context.Context, sandbox string, after int64, limit int, state string) ([]model.TrajectoryEntry, error)
}

// storeSettings reads the settings from the store: always current, nothing to refresh.
type storeSettings struct{ *store.Store }

func (s storeSettings) ProjectPath(ctx context.Context, project string) (string, error) {
	path, err := s.Store.ProjectPath(ctx, project)
	return iam.Display(path), err
}

func (s storeSettings) ServiceCatalog(ctx context.Context) ([]byte, error) {
	return s.GetSetting(ctx, store.CatalogSetting)
}

func (storeSettings) Refresh(context.Context) error { return nil }

// settingsRefresh bounds how long taking up a change made here may take: the fncall
// environments' changes wait for it under the lock of the fncall pools.
const settingsRefresh = 3 * time.Second

// settingsWritten takes up a change of the settings the edge made itself, then acts on it.
func (e *Edge) settingsWritten(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settingsRefresh)
	defer cancel()
	if err := e.settings.Refresh(ctx); err != nil {
		// The next heartbeat takes it up.
		e.log.Warn("take up a change of the settings made here", "err", err)
	}
	e.warmChanged()
}

// SettingsChanged makes the edge follow its Settings now: its warm pools, fncall pools and
// service catalog. A cluster's edge calls it when its copy of the servers' settings changed.
func (e *Edge) SettingsChanged(ctx context.Context) {
	select {
	case <-e.stop:
		return // closed: no pools start any more
	default:
	}
	e.warmChanged()
	if err := e.syncPools(ctx); err != nil {
		e.log.Warn("sync fncall pools", "err", err)
	}
	if err := e.syncCatalog(ctx); err != nil {
		e.log.Warn("sync the service catalog", "err", err)
	}
}
