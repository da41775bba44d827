package edge

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/build"
	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/layers"
	"github.com/corral-dev/corral/internal/limits"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/store"
)

// The edge's side of Dockerfile builds (internal/build drives them): a build's steps run in
// ordinary sandboxes of the build's project, and each step's writable layer becomes a layer of
// kind base named BuildLayerName that stacks (Below) on every layer under it, so a sandbox made
// with it as base gets the whole stack.

// BuildLayerName is the name of the layers builds make; the version is the step's cache key.
const BuildLayerName = "corral.build"

// internal/build keeps types of its own (issue 29 item 5): the methods it calls (build.Backend)
// take and return them, and convert to the API's here, and nowhere else. TestBuildConversion
// holds them equal to the API's.

// buildLayer is what a build reads of layer l.
func buildLayer(l model.Layer) build.Layer {
	return build.Layer{Name: l.Name, Version: l.Version, Digest: l.Digest, Size: l.Size, Files: l.Files,
		Below: l.Below, ImageConfig: buildImageConfig(l.ImageConfig), Project: l.Project, CreatedAt: l.CreatedAt}
}

// apiLayer is a layer a build makes, of kind base.
func apiLayer(l build.Layer) model.Layer {
	return model.Layer{Name: l.Name, Version: l.Version, Kind: model.KindBase, Digest: l.Digest, Size: l.Size, Files: l.Files,
		Below: l.Below, ImageConfig: apiImageConfig(l.ImageConfig), Project: l.Project, CreatedAt: l.CreatedAt}
}

// buildImageConfig is c as a build's (nil stays nil).
func buildImageConfig(c *model.ImageConfig) *build.ImageConfig {
	if c == nil {
		return nil
	}
	out := &build.ImageConfig{Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd, Labels: c.Labels}
	for _, s := range c.Services {
		out.Services = append(out.Services, build.Service(s))
	}
	return out
}

// apiImageConfig is a build's c as the API's (nil stays nil).
func apiImageConfig(c *build.ImageConfig) *model.ImageConfig {
	if c == nil {
		return nil
	}
	out := &model.ImageConfig{Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd, Labels: c.Labels}
	for _, s := range c.Services {
		out.Services = append(out.Services, model.Service(s))
	}
	return out
}

// BuildFrom resolves a build's FROM for project at: a layer NAME:VERSION (or tag) of kind base,
// or a saved environment's name. It returns the layer to make the first sandbox with (stacking
// on below), the number of layers in the stack, and the configuration of its base. An
// environment with a workspace or toolkits is restacked as base layers of the same content
// (BuildLayerName, no new data).
//
// With dry set nothing is published: the answer is the configuration and the depth only.
func (e *Edge) BuildFrom(ctx context.Context, at, ref string, dry bool) (build.Layer, int, *build.ImageConfig, error) {
	top, depth, cfg, err := e.buildFrom(ctx, at, ref, dry)
	return buildLayer(top), depth, buildImageConfig(cfg), err
}

func (e *Edge) buildFrom(ctx context.Context, at, ref string, dry bool) (top model.Layer, depth int, cfg *model.ImageConfig, err error) {
	if !strings.Contains(ref, ":") {
		env, err := e.reader.VisibleEnvironment(ctx, at, ref)
		if errors.Is(err, errdefs.ErrNotFound) {
			return top, 0, nil, errdefs.Invalid("from", "FROM %s: no environment of that name usable in this project, and not a layer NAME:VERSION (import images with `corral layer import`)", ref)
		} else if err != nil {
			return top, 0, nil, err
		}
		base, err := e.resolveLayer(ctx, "from", env.Base, model.KindBase, at)
		if err != nil {
			return top, 0, nil, err
		}
		refs := []string{env.Workspace}
		refs = append(refs, env.Toolkits...)
		top, depth = base, len(base.Below)+1
		below := append(append([]string(nil), base.Below...), base.Name+":"+base.Version)
		for i, r := range refs {
			if r == "" {
				continue
			}
			kind := model.KindToolkit
			if i == 0 {
				kind = model.KindWorkspace
			}
			l, err := e.resolveLayer(ctx, "from", r, kind, at)
			if err != nil {
				return top, 0, nil, err
			}
			if dry {
				depth++
				continue
			}
			// The same content as a base layer that stacks on what is under it here.
			alias := model.Layer{
				Name: BuildLayerName, Version: "from-" + shortKey(l.Digest+"\x00"+strings.Join(below, "\x00")),
				Kind: model.KindBase, Digest: l.Digest, Size: l.Size, Files: l.Files,
				Below: append([]string(nil), below...), CreatedAt: time.Now().UTC(), Project: at,
			}
			if top, err = e.buildPublish(ctx, alias); err != nil {
				return top, 0, nil, err
			}
			below = append(below, top.Name+":"+top.Version)
			depth++
		}
		return top, depth, base.ImageConfig, nil
	}
	l, err := e.resolveLayer(ctx, "from", ref, model.KindBase, at)
	if err != nil {
		return top, 0, nil, err
	}
	return l, len(l.Below) + 1, l.ImageConfig, nil
}

// LayerVisibleInPath reports whether something owned by project owner (as the API names it)
// is usable in project at (canonical).
func LayerVisibleInPath(owner, at string) bool {
	return catalog.LayerVisibleIn(model.Layer{Project: owner}, at)
}

// shortKey is a 40-hex-digit digest of s, a layer version.
func shortKey(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:20])
}

// BuildLayer returns the build layer of cache key key, if one is published and visible in at.
func (e *Edge) BuildLayer(ctx context.Context, at, key string) (build.Layer, bool, error) {
	l, err := e.reader.VisibleLayer(ctx, at, BuildLayerName, key)
	if errors.Is(err, errdefs.ErrNotFound) {
		return build.Layer{}, false, nil
	}
	return buildLayer(l), err == nil, err
}

// BuildPublish publishes a build layer (of kind base) whose content is already stored. A
// version published already (an identical step of another build, or a race) is returned as it
// is.
func (e *Edge) BuildPublish(ctx context.Context, l build.Layer) (build.Layer, error) {
	got, err := e.buildPublish(ctx, apiLayer(l))
	return buildLayer(got), err
}

func (e *Edge) buildPublish(ctx context.Context, l model.Layer) (model.Layer, error) {
	at, err := iam.ParsePath("project", l.Project)
	if err != nil {
		return model.Layer{}, err
	}
	if got, err := e.reader.VisibleLayer(ctx, at, l.Name, l.Version); err == nil {
		return got, nil
	}
	got, _, err := e.PublishLayer(ctx, l)
	if err != nil && errors.Is(err, errdefs.ErrConflict) {
		// Another build published the same step first; its result stands.
		if prev, gerr := e.reader.VisibleLayer(ctx, at, l.Name, l.Version); gerr == nil {
			return prev, nil
		}
	}
	return got, err
}

// BuildExec runs a build step's command in sandbox id and passes its output (stdout and
// stderr) to out. It returns the command's exit.
func (e *Edge) BuildExec(ctx context.Context, id string, cmd build.Command, out func(data []byte)) (*build.Exit, error) {
	sb, err := e.ownSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	areq, err := e.agentRequest(sb, model.ExecRequest{Argv: cmd.Argv, Env: cmd.Env, Cwd: cmd.Cwd, User: cmd.User})
	if err != nil {
		return nil, err
	}
	sess, err := sb.agent.Exec(ctx, areq)
	if err == nil {
		if err = startError(sess.Info()); err != nil {
			sess.Close()
		}
	}
	if err != nil {
		return nil, err
	}
	defer sess.Close()
	// A cancelled build stops reading; deleting the sandbox then ends the command.
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()
	for {
		ev, err := sess.Next()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil {
			return nil, fmt.Errorf("command output: %w", err)
		}
		sb.touch()
		switch ev.Type {
		case agentrpc.EventExit:
			return buildExit(ev.Exit), nil
		case agentrpc.EventStdout, agentrpc.EventStderr:
			out(ev.Data)
		}
	}
}

// BuildTarIn extracts a tar into directory dir of sandbox id (made if missing), everything
// owned by user (empty: root).
func (e *Edge) BuildTarIn(ctx context.Context, id, dir, user string, r io.Reader) error {
	sb, err := e.ownSandbox(ctx, id)
	if err != nil {
		return err
	}
	if user != "" && !catalog.ValidUser(user) {
		return errdefs.Invalid("user", "%q is not a user name or uid[:gid]", user)
	}
	if err := checkPath("path", dir); err != nil {
		return err
	}
	return sb.agent.TarIn(ctx, dir, r, agentrpc.WriteOptions{User: user, Parents: true})
}

// BuildCommit makes the writable layer of build sandbox id into layer l (Name, Version,
// Below, Project set by the caller): imported, then published. On gVisor the sandbox must be
// idle (its step ended) and synced, since it cannot be frozen.
func (e *Edge) BuildCommit(ctx context.Context, id string, bl build.Layer) (build.Layer, error) {
	l, err := e.buildCommit(ctx, id, apiLayer(bl))
	return buildLayer(l), err
}

func (e *Edge) buildCommit(ctx context.Context, id string, l model.Layer) (model.Layer, error) {
	sb, err := e.ownSandbox(ctx, id)
	if err != nil {
		return model.Layer{}, err
	}
	ctx = context.WithoutCancel(ctx)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.gone {
		return model.Layer{}, errdefs.Conflict("sandbox %s stopped", id)
	}
	rec, err := e.record(ctx, id)
	if err != nil {
		return model.Layer{}, err
	}
	var blob layers.Blob
	switch rec.Runtime {
	case RuntimeRunc:
		blob, _, _, err = e.packUpperLocked(ctx, sb, layers.TarOptions{})
	case RuntimeGVisor:
		// Nothing runs but the agent, and the step synced: the upper dir is what it wrote.
		var upper string
		if upper, err = e.rt.UpperDir(id); err == nil {
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(layers.WriteTarWith(ctx, upper, pw, layers.TarOptions{})) }()
			blob, err = e.layers.ImportTar(ctx, pr)
			pr.CloseWithError(err)
		}
	default:
		err = errdefs.Invalid("runtime", "builds run on runc or gvisor, not %s", rec.Runtime)
	}
	if err != nil {
		return model.Layer{}, fmt.Errorf("pack the writable layer of sandbox %s: %w", id, err)
	}
	l.Kind, l.Digest, l.Size, l.Files, l.CreatedAt = model.KindBase, blob.Digest, blob.Size, blob.Files, time.Now().UTC()
	return e.buildPublish(ctx, l)
}

// BuildCheckTarget validates the name of a build's environment (and layer). Whether its
// project exists the catalogue answers with the name's owner (EnvironmentOwner).
func (e *Edge) BuildCheckTarget(name string) error {
	return catalog.ValidateLayerName("name", "name", name, "b-0")
}

// BuildCheckNetwork validates a build's network policy (nil: no network).
func (e *Edge) BuildCheckNetwork(p *netpolicy.Policy) error {
	_, err := e.compileNetwork((*model.NetworkPolicy)(p))
	return err
}

// BuildRoom fails with errdefs.ErrNodeFull when the node has no room now for a build step's
// sandbox (a container of the default limits): a build is refused before its context is read,
// so a cluster's replica sends it to another node rather than start one whose steps cannot run
// here. (Room can still run out before a step; the step then fails as a create would.)
func (e *Edge) BuildRoom() error {
	lim, err := e.policy.Resolve(limits.TierContainer, limits.Limits{})
	if err != nil {
		return err
	}
	rec := &store.Sandbox{Sandbox: model.Sandbox{ID: "of a build's step", Limits: model.Limits(lim)}}
	e.capMu.Lock()
	defer e.capMu.Unlock()
	return e.roomLocked(rec, 1)
}

// BuildSandbox creates a sandbox for one build step and returns its ID.
func (e *Edge) BuildSandbox(ctx context.Context, s build.Sandbox) (string, error) {
	rec, err := e.Create(ctx, model.CreateRequest{Base: s.Base, Project: s.Project, Runtime: s.Runtime,
		Network: (*model.NetworkPolicy)(s.Network), TTL: s.TTL, Labels: s.Labels})
	if err != nil {
		return "", err
	}
	return rec.ID, nil
}

// BuildDelete removes a build step's sandbox.
func (e *Edge) BuildDelete(ctx context.Context, id string) error {
	_, err := e.Delete(context.WithoutCancel(ctx), id)
	return err
}

// EnvironmentOwner returns the project (canonical; the root is "") owning environment name,
// and whether there is one, as a build in project at asks.
func (e *Edge) EnvironmentOwner(ctx context.Context, at, name string) (string, bool, error) {
	return e.reader.EnvironmentOwner(ctx, at, name)
}

// ValidateImageConfig is the package function, for builds.
func (e *Edge) ValidateImageConfig(c *build.ImageConfig) error {
	return catalog.ValidateImageConfig(apiImageConfig(c))
}

// buildExit is how a build step's command ended (nil stays nil).
func buildExit(x *agentrpc.Exit) *build.Exit {
	if x == nil {
		return nil
	}
	return &build.Exit{Code: x.Code, Signal: x.Signal, TimedOut: x.TimedOut, OOMKilled: x.OOMKilled, Error: x.Error}
}
