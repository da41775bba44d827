// Package catalog resolves what a create names in the catalogue (its project, its environment's
// defaults and layers, a snapshot's chain, layer versions and tags, its volumes) into what a
// node needs to start the sandbox: a Resolution. It also holds the checks of the names and
// fields those lookups take.
//
// `corral up` resolves in its own process. A cluster's servers resolve for their edges (the node
// channel's PathResolve), so that an edge reads no catalogue to create a sandbox. What depends
// on the node (the tiers and runtimes it offers, its limits policy, its labels, its network)
// stays with the edge.
package catalog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/lazyregexp"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/runtime"
	"github.com/corral-dev/corral/internal/store"
)

// The tiers. A create call names container, microvm or vm; fncall's containers are made by
// fncall environments.
const (
	TierContainer = "container"
	TierMicroVM   = "microvm"
	TierVM        = "vm"
	TierFncall    = "fncall"
)

// MaxToolkits bounds the toolkits one create stacks.
const MaxToolkits = 32

// Resolution is a create as the catalogue resolves it.
type Resolution struct {
	// Request is the create with its environment's defaults (tier, runtime, network) applied
	// and its layer references rewritten to the versions they resolved to (a tag is recorded
	// as its version); an environment's or snapshot's layers are set in it.
	Request model.CreateRequest `json:"request"`
	// Tier is the create's tier (TierContainer when it names none); whether the node offers
	// it is the node's to check.
	Tier string `json:"tier"`
	// ProjectID and ProjectPath are the create's project's (the path canonical).
	ProjectID   string `json:"project_id"`
	ProjectPath string `json:"project_path"`
	// Volumes are the create's volume mounts, checked, and VolumeIDs the volumes' IDs.
	Volumes   []model.VolumeMount `json:"volumes,omitempty"`
	VolumeIDs []string            `json:"volume_ids,omitempty"`
	// Digests are the layers' digests, bottom first, and Fill each one's background fill
	// setting (corral.Layer.FillRate).
	Digests []string         `json:"digests"`
	Fill    map[string]int64 `json:"fill,omitempty"`
	// ImageConfig is the base layer's image configuration; nil: none.
	ImageConfig *model.ImageConfig `json:"image_config,omitempty"`
	// Services are every layer's, bottom first.
	Services []model.Service `json:"services,omitempty"`
	// Template: the environment starts its microvms from a template.
	Template bool `json:"template,omitempty"`
}

// Resolver resolves creates from the store.
type Resolver struct {
	Store *store.Store
	// Adopt looks a layer name the store does not have up in the shared catalogue (the blob
	// store's refs, which other installations publish to) and returns how many versions it
	// adopted. Nil: no shared catalogue (the servers of a cluster, whose edges all publish to
	// the one store).
	Adopt func(ctx context.Context, name string) (int, error)
	// Node is the node whose volumes a create may mount (`corral up`: a volume lives on the
	// node that made it); "" for any (a cluster: volumes are versions in the blob store).
	Node string
	Log  *slog.Logger
}

// Resolve resolves req (calls: a container of an fncall environment's pool, which takes no
// environment defaults).
func (r *Resolver) Resolve(ctx context.Context, req model.CreateRequest, calls bool) (*Resolution, error) {
	var env *model.Environment
	if req.Environment != "" {
		e, err := r.Store.GetEnvironment(ctx, req.Environment)
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return nil, err
		}
		if err == nil {
			env = &e
		}
		if env != nil && !calls {
			req = withDefaults(req, *env)
		}
	}
	tier, err := Tier(req, calls)
	if err != nil {
		return nil, err
	}
	project, err := ProjectAt(ctx, r.Store, req.Project)
	if err != nil {
		return nil, err
	}
	res := &Resolution{Tier: tier, ProjectID: project.ID, ProjectPath: project.Path}
	if res.Volumes, res.VolumeIDs, err = r.volumes(ctx, tier, project, req.Volumes); err != nil {
		return nil, err
	}
	if err := CheckFields(req, tier); err != nil {
		return nil, err
	}
	if err := r.compose(ctx, res, &req, env); err != nil {
		return nil, err
	}
	res.Request = req
	return res, nil
}

// withDefaults fills in what req leaves to its environment env: its tier and runtime (when the
// request names neither), and its network policy.
func withDefaults(req model.CreateRequest, env model.Environment) model.CreateRequest {
	if req.Tier != "" && req.Runtime != "" && req.Network != nil {
		return req
	}
	if req.Tier == "" && req.Runtime == "" {
		req.Tier = env.Tier
	}
	if req.Runtime == "" && (req.Tier == "" || req.Tier == TierContainer) {
		req.Runtime = env.Runtime
	}
	if req.Network == nil && env.Network != nil {
		n := *env.Network
		req.Network = &n
	}
	return req
}

// Tier returns the tier a create names (calls: an fncall pool's container), refusing a name that
// is not a tier a create may name. Whether a node offers it is the node's question.
func Tier(req model.CreateRequest, calls bool) (string, error) {
	switch {
	case calls:
		return TierFncall, nil
	case req.Tier == "", req.Tier == TierContainer:
		return TierContainer, nil
	case req.Tier == TierFncall:
		return "", errdefs.Invalid("tier", "fncall containers are made by fncall environments (POST /v1/fncall), not created directly")
	case req.Tier == TierVM, req.Tier == TierMicroVM:
		return req.Tier, nil
	}
	return "", errdefs.Invalid("tier", "%q is not a tier: want container, microvm or vm", req.Tier)
}

// CheckFields checks the fields of a create that need no lookup: env, labels, hostname, and
// that a vm names its disk image and nothing else names one.
func CheckFields(req model.CreateRequest, tier string) error {
	if err := ValidateEnv("env", req.Env); err != nil {
		return err
	}
	if err := ValidateLabels(req.Labels); err != nil {
		return err
	}
	if req.Hostname != "" && !hostnameRE.MatchString(req.Hostname) {
		return errdefs.Invalid("hostname", "%q is not a valid hostname (letters, digits and '-', at most 63)", req.Hostname)
	}
	if tier == TierVM {
		if req.Base != "" || req.Workspace != "" || len(req.Toolkits) > 0 || req.FromSnapshot != "" || req.Environment != "" {
			return errdefs.Invalid("image", "a vm sandbox boots its disk image (image); base, workspace, toolkits, from_snapshot and environment are for containers and microvms")
		}
		if req.Image == "" {
			return errdefs.Invalid("image", "a vm sandbox needs its disk image: a vm-image layer NAME:VERSION (corral vm-image build)")
		}
	} else if req.Image != "" {
		return errdefs.Invalid("image", "a disk image is for the vm tier (tier vm); containers and microvms take base, workspace and toolkits")
	}
	return nil
}

// compose resolves the layers of req (its environment's, env, or its snapshot's, when it names
// one) into res, and rewrites req's layer references to the versions they resolved to.
func (r *Resolver) compose(ctx context.Context, res *Resolution, req *model.CreateRequest, env *model.Environment) error {
	at := res.ProjectPath
	if req.Environment != "" {
		if req.Base != "" || req.Workspace != "" || len(req.Toolkits) > 0 || req.FromSnapshot != "" {
			return errdefs.Invalid("environment", "cannot be combined with base, workspace, toolkits or from_snapshot: the environment names its layers")
		}
		if env == nil {
			return errdefs.Invalid("environment", "environment %q is not saved (see `corral env ls`)", req.Environment)
		}
		if owner, _ := iam.ParsePath("project", env.Project); !iam.Within(at, owner) {
			return errdefs.Invalid("environment", "environment %q is not usable in project %s", req.Environment, iam.Display(at))
		}
		req.Base, req.Workspace, req.Toolkits = env.Base, env.Workspace, env.Toolkits
		res.Template = env.MicroVMTemplate
	}
	var snap model.Layer
	if req.FromSnapshot != "" {
		if req.Base != "" || req.Workspace != "" || len(req.Toolkits) > 0 {
			return errdefs.Invalid("from_snapshot", "cannot be combined with base, workspace or toolkits: a snapshot brings its own environment")
		}
		name, version, err := ParseLayerRef("from_snapshot", req.FromSnapshot)
		if err != nil {
			return err
		}
		snap, err = r.Store.GetLayer(ctx, name, version)
		if errors.Is(err, errdefs.ErrNotFound) || err == nil && !LayerVisibleIn(snap, at) {
			return NotPublished("from_snapshot", req.FromSnapshot)
		} else if err != nil {
			return err
		}
		if snap.Kind != model.KindSnapshot || snap.Snapshot == nil {
			return errdefs.Invalid("from_snapshot", "layer %s is a %s layer, not a snapshot", req.FromSnapshot, snap.Kind)
		}
		req.Base, req.Workspace, req.Toolkits = snap.Snapshot.Base, snap.Snapshot.Workspace, snap.Snapshot.Toolkits
	}
	if req.Base == "" && res.Tier != TierVM {
		return errdefs.Invalid("base", "a base layer is required (NAME:VERSION)")
	}
	if len(req.Toolkits) > MaxToolkits {
		return errdefs.Invalid("toolkits", "at most %d toolkits, got %d", MaxToolkits, len(req.Toolkits))
	}
	// Bottom to top: base, workspace, toolkits in order, then a snapshot's chain and the snapshot.
	type ref struct{ field, ref, kind string }
	refs := []ref{{"base", req.Base, model.KindBase}}
	if res.Tier == TierVM {
		refs = []ref{{"image", req.Image, model.KindVMImage}}
	}
	if req.Workspace != "" {
		refs = append(refs, ref{"workspace", req.Workspace, model.KindWorkspace})
	}
	for i, t := range req.Toolkits {
		refs = append(refs, ref{fmt.Sprintf("toolkits[%d]", i), t, model.KindToolkit})
	}
	if req.FromSnapshot != "" {
		for _, p := range snap.Snapshot.Parents {
			refs = append(refs, ref{"from_snapshot", p, model.KindSnapshot})
		}
		refs = append(refs, ref{"from_snapshot", req.FromSnapshot, model.KindSnapshot})
	}
	res.Fill = map[string]int64{}
	// Tags (python:latest) are recorded as the versions they resolved to.
	resolved := make([]string, 0, len(refs))
	for _, rf := range refs {
		l, err := r.Layer(ctx, rf.field, rf.ref, rf.kind, at)
		if err != nil {
			return err
		}
		resolved = append(resolved, l.Name+":"+l.Version)
		if rf.field == "base" && l.ImageConfig != nil {
			res.ImageConfig = l.ImageConfig
		}
		if l.ImageConfig != nil {
			res.Services = append(res.Services, l.ImageConfig.Services...)
		}
		// A layer imported in parts stacks on them.
		for _, b := range l.Below {
			part, err := r.Layer(ctx, rf.field, b, rf.kind, at)
			if err != nil {
				return fmt.Errorf("layer %s stacks on %s: %w", rf.ref, b, err)
			}
			res.Digests = append(res.Digests, part.Digest)
			res.Fill[part.Digest] = part.FillRate
		}
		res.Digests = append(res.Digests, l.Digest)
		res.Fill[l.Digest] = l.FillRate
	}
	if res.Tier == TierVM {
		req.Image = resolved[0]
	} else if req.FromSnapshot == "" {
		req.Base = resolved[0]
		if req.Workspace != "" {
			req.Workspace, resolved = resolved[1], resolved[1:]
		}
		req.Toolkits = append([]string(nil), resolved[1:]...)
		if len(req.Toolkits) == 0 {
			req.Toolkits = nil
		}
	}
	return nil
}

// Layer returns the published layer ref (NAME:VERSION or NAME:TAG) names, if project at
// (canonical) sees it, checking its kind; field names the request's field in errors.
func (r *Resolver) Layer(ctx context.Context, field, ref, kind, at string) (model.Layer, error) {
	return LayerIn(ctx, r, field, ref, kind, at)
}

// VisibleLayer returns the version name:version (or the one tag version names), if project at
// (canonical) sees it. One it does not see is answered as one that does not exist
// (errdefs.ErrNotFound). A resolver that adopts looks in the shared catalogue on a miss.
func (r *Resolver) VisibleLayer(ctx context.Context, at, name, version string) (model.Layer, error) {
	l, err := r.Store.GetLayer(ctx, name, version)
	if err == nil && !LayerVisibleIn(l, at) {
		err = errdefs.NotFound("layer %s:%s", name, version) // and looked for as if it were
	}
	if errors.Is(err, errdefs.ErrNotFound) && r.Adopt != nil {
		// Perhaps another installation sharing the blob store published it.
		if n, serr := r.Adopt(ctx, name); serr != nil {
			r.log().Warn("look up a layer in the shared catalogue", "layer", name+":"+version, "err", serr)
		} else if n > 0 {
			l, err = r.Store.GetLayer(ctx, name, version)
		}
	}
	if err == nil && !LayerVisibleIn(l, at) {
		err = errdefs.NotFound("layer %s:%s", name, version)
	}
	return l, err
}

// ReadableLayer returns version name:version (or the one tag version names), whichever project
// owns it: the API checks its caller may read it (the servers, for a cluster's edge, do).
func (r *Resolver) ReadableLayer(ctx context.Context, name, version string) (model.Layer, error) {
	return r.Store.GetLayer(ctx, name, version)
}

// LayerVersions returns every published version of layer name (none: an empty list).
func (r *Resolver) LayerVersions(ctx context.Context, name string) ([]model.Layer, error) {
	return r.Store.ListLayers(ctx, name)
}

// VisibleEnvironment returns environment name, if project at (canonical) may use it (it is
// at's or an ancestor's). One it may not use is answered as one that does not exist
// (errdefs.ErrNotFound).
func (r *Resolver) VisibleEnvironment(ctx context.Context, at, name string) (model.Environment, error) {
	env, err := r.Store.GetEnvironment(ctx, name)
	if err == nil && !LayerVisibleIn(model.Layer{Project: env.Project}, at) {
		err = errdefs.NotFound("environment %s", name)
	}
	return env, err
}

// EnvironmentOwner returns the project (canonical; the root is "") owning environment name,
// and whether there is one: environment names are one namespace, so a name another project
// holds cannot be saved. at, the project asking (canonical), must exist; it does not change the
// answer (the servers answer a caller who may read layers there).
func (r *Resolver) EnvironmentOwner(ctx context.Context, at, name string) (string, bool, error) {
	if _, err := ProjectAt(ctx, r.Store, iam.Display(at)); err != nil {
		return "", false, err
	}
	env, err := r.Store.GetEnvironment(ctx, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return "", false, nil
	} else if err != nil {
		return "", false, err
	}
	owner, err := iam.ParsePath("project", env.Project)
	return owner, err == nil, err
}

func (r *Resolver) log() *slog.Logger {
	if r.Log == nil {
		return slog.Default()
	}
	return r.Log
}

// volumes checks a create's volume mounts and looks their volumes up in project.
func (r *Resolver) volumes(ctx context.Context, tier string, project *store.ProjectRecord, mounts []model.VolumeMount) ([]model.VolumeMount, []string, error) {
	if len(mounts) == 0 {
		return nil, nil, nil
	}
	if tier != TierContainer && tier != TierMicroVM {
		return nil, nil, errdefs.Invalid("volumes", "volumes mount into containers and microvms, not the %s tier", tier)
	}
	if len(mounts) > runtime.MaxVolumes {
		return nil, nil, errdefs.Invalid("volumes", "%d volumes, at most %d", len(mounts), runtime.MaxVolumes)
	}
	out := make([]model.VolumeMount, len(mounts))
	ids := make([]string, len(mounts))
	for i, m := range mounts {
		field := fmt.Sprintf("volumes[%d]", i)
		if !ValidVolumeName(m.Name) {
			return nil, nil, errdefs.Invalid(field+".name", "%q is not a volume name", m.Name)
		}
		if err := runtime.CheckVolumePath(field+".path", m.Path); err != nil {
			return nil, nil, err
		}
		for j, o := range out[:i] {
			if o.Name == m.Name {
				return nil, nil, errdefs.Invalid(field+".name", "volume %s is named twice (volumes[%d])", m.Name, j)
			}
			if o.Path == m.Path || strings.HasPrefix(m.Path, o.Path+"/") || strings.HasPrefix(o.Path, m.Path+"/") {
				return nil, nil, errdefs.Invalid(field+".path", "%s overlaps volumes[%d] at %s", m.Path, j, o.Path)
			}
		}
		v, err := r.Store.GetVolume(ctx, project.ID, m.Name)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, nil, errdefs.Invalid(field+".name", "volume %s does not exist in project %s (see `corral volume ls`)", m.Name, iam.Display(project.Path))
		} else if err != nil {
			return nil, nil, err
		}
		if r.Node != "" && v.Node != r.Node {
			return nil, nil, errdefs.Invalid(field+".name", "volume %s lives on node %s, not on %s", m.Name, v.Node, r.Node)
		}
		out[i], ids[i] = m, v.ID
	}
	return out, ids, nil
}

// ProjectAt returns the project at path (a request's field "project"; "" is the root): invalid
// when it does not exist.
func ProjectAt(ctx context.Context, st *store.Store, path string) (*store.ProjectRecord, error) {
	p, err := iam.ParsePath("project", path)
	if err != nil {
		return nil, err
	}
	rec, err := st.GetProject(ctx, p)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, errdefs.Invalid("project", "project %s does not exist", iam.Display(p))
	}
	return rec, err
}

// LayerVisibleIn reports whether project at (canonical) sees layer l (iam.LayerVisible): a layer
// it does not see is, to it, not published.
func LayerVisibleIn(l model.Layer, at string) bool {
	owner, err := iam.ParsePath("project", l.Project)
	return err == nil && iam.LayerVisible(owner, l.Private, l.Public, at)
}

// NotPublished is the error for a layer reference that names no layer the project sees: the
// answer tells nothing about other projects' layers.
func NotPublished(field, ref string) error {
	return errdefs.Invalid(field, "layer %s is not published (see `corral layer ls`)", ref)
}

var (
	hostnameRE   = lazyregexp.New(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)
	envKeyRE     = lazyregexp.New(`^[A-Za-z_][A-Za-z0-9_]*$`)
	labelKeyRE   = lazyregexp.New(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,62}[A-Za-z0-9])?$`)
	layerNameRE  = lazyregexp.New(`^[a-z0-9]([a-z0-9._-]{0,126}[a-z0-9])?$`)
	layerVerRE   = lazyregexp.New(`^[A-Za-z0-9_]([A-Za-z0-9._-]{0,126})$`)
	volumeNameRE = lazyregexp.New(`^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$`)
	maxEnvLength = 128 << 10
)

// ValidLayerName reports whether name is a layer's (or an environment's) name: lowercase
// letters, digits, '.', '_' and '-', at most 128.
func ValidLayerName(name string) bool { return layerNameRE.MatchString(name) }

// ValidateName checks the name of a catalogue object (what: "layer", "environment", "fncall
// environment"), which has a layer name's syntax; field names it in the error.
func ValidateName(field, what, name string) error {
	if !ValidLayerName(name) {
		return errdefs.Invalid(field, "%s name %q must be lowercase letters, digits, '.', '_' or '-' (at most 128)", what, name)
	}
	return nil
}

// ValidVolumeName reports whether name is a volume's name: lowercase letters, digits, '.', '_'
// and '-', at most 63.
func ValidVolumeName(name string) bool { return volumeNameRE.MatchString(name) }

// ValidateEnv checks environment variables (KEY=VALUE) of field.
func ValidateEnv(field string, env []string) error {
	total := 0
	for i, kv := range env {
		k, _, ok := strings.Cut(kv, "=")
		// The message names the key only: a value may be a secret, and errors reach logs.
		if !ok {
			return errdefs.Invalid(fmt.Sprintf("%s[%d]", field, i), "is not KEY=VALUE (no '=')")
		}
		if !envKeyRE.MatchString(k) {
			return errdefs.Invalid(fmt.Sprintf("%s[%d]", field, i), "%q is not a valid variable name", k)
		}
		if strings.IndexByte(kv, 0) >= 0 {
			return errdefs.Invalid(fmt.Sprintf("%s[%d]", field, i), "contains a NUL byte")
		}
		total += len(kv)
	}
	if total > maxEnvLength {
		return errdefs.Invalid(field, "%d bytes in all, more than %d", total, maxEnvLength)
	}
	return nil
}

// ValidateLabels checks a sandbox's labels.
func ValidateLabels(labels map[string]string) error {
	if len(labels) > 64 {
		return errdefs.Invalid("labels", "at most 64 labels, got %d", len(labels))
	}
	for k, v := range labels {
		if !labelKeyRE.MatchString(k) {
			return errdefs.Invalid("labels", "key %q must be 1-64 letters, digits, '.', '_', '/' or '-'", k)
		}
		if len(v) > 256 || strings.ContainsAny(v, "\x00\n") {
			return errdefs.Invalid("labels."+k, "value must be at most 256 bytes without NUL or newline")
		}
	}
	return nil
}

// ParseLayerRef splits "NAME:VERSION" and validates both parts; field names the request field.
func ParseLayerRef(field, ref string) (name, version string, err error) {
	name, version, ok := strings.Cut(ref, ":")
	if !ok {
		return "", "", errdefs.Invalid(field, "%q is not NAME:VERSION", ref)
	}
	if err := ValidateLayerName(field, field, name, version); err != nil {
		return "", "", err
	}
	return name, version, nil
}

// ValidateLayerName checks a layer's name and version (or tag); the fields name them in errors.
func ValidateLayerName(nameField, versionField, name, version string) error {
	if err := ValidateName(nameField, "layer", name); err != nil {
		return err
	}
	if !layerVerRE.MatchString(version) {
		return errdefs.Invalid(versionField, "layer version %q must be letters, digits, '.', '_' or '-' (at most 128)", version)
	}
	return nil
}
