package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/layers"
	"github.com/corral-dev/corral/internal/model"
)

// The shared catalogue. Every Corral that uses one blob store sees the layer versions the others
// publish: each Corral that has a version (published it, or adopted it from another) writes
//
//	refs/<name>/<version>/<digest hex>/<instance>.json   the corral.Layer, as the catalogue holds it
//
// where <instance> is a random name of this Corral's data directory (store.Instance). The digest is in the key so
// that the set of digests anyone holds can be listed without reading each object; the instance is
// in it so that one Corral deleting its version leaves the others' refs, and so their content, in
// place. A Corral records the others' versions in its own catalogue when it lists layers or
// resolves a version it does not know, and never deletes content that a ref names. Tags and
// environments stay per Corral.
//
// Every version has a ref, so no Corral's collector deletes its content, but only public ones
// (Layer.Public) are adopted by the others: a project's layer means nothing in another
// installation's tree, and a snapshot kept to one project must not become usable by another
// installation's tenants. An adopted version belongs to the adopting Corral's root project and
// stays public there. Making a version public or taking it back rewrites its ref; a Corral that
// adopted it before it was taken back keeps it (take it back there too).
//
// A cluster's edges adopt nothing: every edge publishes to the servers' one catalogue
// (Config.Publisher), which adds a version only for a caller who may publish it, and a version
// another installation published is only a ref in the blob store, which no server reads. Their
// refs still keep their content from other installations' collectors.

const refsPrefix = "refs/"

func (e *Edge) refKey(name, version, digest string) string {
	return refsPrefix + name + "/" + version + "/" + strings.TrimPrefix(digest, "sha256:") + "/" + e.instance + ".json"
}

// loadInstance reads this Corral's instance name (store.Instance).
func (e *Edge) loadInstance(ctx context.Context) (err error) {
	if e.instance = e.cfg.Instance; e.instance != "" {
		return nil
	}
	e.instance, err = e.store.Instance(ctx, e.cfg.Node)
	return err
}

// PublishLayer records l (its blob already imported) in the catalogue and the shared catalogue.
// It reports whether the version is new. When the catalogue refuses it (a version reused with
// other content), the imported blob is removed unless something else uses it.
func (e *Edge) PublishLayer(ctx context.Context, l model.Layer) (model.Layer, bool, error) {
	ctx = context.WithoutCancel(ctx)
	var err error
	if l.Kind == model.KindVMImage {
		// A disk image is checked before anyone can boot it.
		if len(l.Below) > 0 {
			err = errdefs.Invalid("below", "a vm-image layer is one disk image; it stacks on nothing")
		} else if _, err = e.CheckVMImage(ctx, l.Digest); err != nil {
			err = fmt.Errorf("layer %s:%s is not a usable vm image: %w", l.Name, l.Version, err)
		}
	}
	var got model.Layer
	var created bool
	if err == nil {
		e.layersMu.RLock()
		got, created, err = e.publisher.PublishLayer(ctx, l)
		e.layersMu.RUnlock()
	}
	if err != nil {
		e.layersMu.Lock()
		if _, rerr := e.removeIfUnused(ctx, l.Digest); rerr != nil {
			e.log.Warn("remove the blob of a refused publish", "digest", l.Digest, "err", rerr)
		}
		e.layersMu.Unlock()
		return model.Layer{}, false, err
	}
	if created && e.cfg.Shared != nil {
		if err := e.shareVersion(ctx, got); err != nil {
			// Other nodes will not see it, and their collectors may delete its content.
			e.log.Error("record a published layer in the shared catalogue", "layer", got.Name+":"+got.Version, "err", err)
			return got, created, fmt.Errorf("layer %s:%s published on this node only: %w", got.Name, got.Version, err)
		}
	}
	return got, created, nil
}

// shareVersion writes l to the shared catalogue. Tags stay per node, and so do projects: each
// installation has its own tree.
func (e *Edge) shareVersion(ctx context.Context, l model.Layer) error {
	l.Tags, l.Project, l.Private = nil, "", false // Public stays: only public versions are adopted
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	return e.cfg.Shared.Put(ctx, e.refKey(l.Name, l.Version, l.Digest), bytes.NewReader(b), int64(len(b)))
}

// shareAll records in the shared catalogue every version of this node's catalogue that it lacks:
// versions published before the blob store was shared, or whose shareVersion failed. A
// cluster's edge keeps no catalogue (the servers do, and a cluster's blob store is shared
// from its start): it shares each version it publishes as it publishes it.
func (e *Edge) shareAll(ctx context.Context) error {
	if e.cfg.Shared == nil || e.cfg.Publisher != nil {
		return nil
	}
	infos, err := e.cfg.Shared.List(ctx, refsPrefix)
	if err != nil {
		return fmt.Errorf("list the shared catalogue: %w", err)
	}
	have := make(map[string]bool, len(infos))
	for _, in := range infos {
		have[in.Key] = true
	}
	local, err := e.store.ListLayers(ctx, "")
	if err != nil {
		return err
	}
	n := 0
	for _, l := range local {
		if have[e.refKey(l.Name, l.Version, l.Digest)] {
			continue
		}
		if err := e.shareVersion(ctx, l); err != nil {
			return err
		}
		n++
	}
	if n > 0 {
		e.log.Info("recorded layer versions in the shared catalogue", "count", n, "store", e.cfg.Shared.String())
	}
	return nil
}

// SetLayerPublic shows the published version name:version to every project, or takes it back
// to its project's subtree, and rewrites its ref in the shared catalogue to say so.
func (e *Edge) SetLayerPublic(ctx context.Context, name, version string, public bool) (model.Layer, error) {
	l, err := e.publisher.SetLayerPublic(ctx, name, version, public)
	if err != nil {
		return model.Layer{}, err
	}
	if e.cfg.Shared != nil {
		if err := e.shareVersion(context.WithoutCancel(ctx), l); err != nil {
			return l, fmt.Errorf("layer %s:%s changed on this node only; the shared catalogue still says otherwise: %w", name, version, err)
		}
	}
	return l, nil
}

// SetLayerFillRate sets the background fill rate of the published version name:version.
func (e *Edge) SetLayerFillRate(ctx context.Context, name, version string, rate int64) (model.Layer, error) {
	return e.publisher.SetLayerFillRate(ctx, name, version, rate)
}

// adopts reports whether this node adopts versions from the shared catalogue: when there is
// one, and the node keeps its own catalogue (not a cluster's edge).
func (e *Edge) adopts() bool { return e.cfg.Shared != nil && e.cfg.Publisher == nil }

// unshareVersion removes name:version from the shared catalogue.
func (e *Edge) unshareVersion(ctx context.Context, l model.Layer) error {
	if e.cfg.Shared == nil {
		return nil
	}
	return e.cfg.Shared.Delete(ctx, e.refKey(l.Name, l.Version, l.Digest))
}

// sharedDigests returns the digests that versions in the shared catalogue name.
func (e *Edge) sharedDigests(ctx context.Context) (map[string]bool, error) {
	out := map[string]bool{}
	if e.cfg.Shared == nil {
		return out, nil
	}
	infos, err := e.cfg.Shared.List(ctx, refsPrefix)
	if err != nil {
		return nil, fmt.Errorf("list the shared catalogue: %w", err)
	}
	for _, in := range infos {
		if _, _, digest, ok := parseRefKey(in.Key); ok {
			out[digest] = true
		}
	}
	return out, nil
}

func parseRefKey(key string) (name, version, digest string, ok bool) {
	parts := strings.Split(strings.TrimPrefix(key, refsPrefix), "/")
	if len(parts) != 4 || !strings.HasSuffix(parts[3], ".json") {
		return "", "", "", false
	}
	return parts[0], parts[1], "sha256:" + parts[2], true
}

// SyncShared records in this node's catalogue the versions of the shared catalogue it lacks
// (name is "" for all) and returns how many it added. A version this node has with other content
// is left alone and logged. A cluster's edge adopts nothing (adopts).
func (e *Edge) SyncShared(ctx context.Context, name string) (int, error) {
	if !e.adopts() || (name != "" && !catalog.ValidLayerName(name)) {
		return 0, nil // no such name can be published
	}
	prefix := refsPrefix
	if name != "" {
		prefix += name + "/"
	}
	infos, err := e.cfg.Shared.List(ctx, prefix)
	if err != nil {
		return 0, fmt.Errorf("list the shared catalogue: %w", err)
	}
	added := 0
	for _, in := range infos {
		n, v, digest, ok := parseRefKey(in.Key)
		if !ok {
			continue
		}
		ok, err := e.adoptShared(ctx, in.Key, n, v, digest)
		if err != nil {
			e.log.Warn("skip a version of the shared catalogue", "key", in.Key, "err", err)
			continue
		}
		if ok {
			added++
		}
	}
	return added, nil
}

// adoptShared records one shared version unless the catalogue has name:version already.
func (e *Edge) adoptShared(ctx context.Context, key, name, version, digest string) (bool, error) {
	if l, err := e.store.GetLayer(ctx, name, version); err == nil {
		if l.Digest != digest {
			return false, fmt.Errorf("this node has %s:%s as %s; the shared catalogue says %s", name, version, l.Digest, digest)
		}
		return false, nil
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return false, err
	}
	rc, err := e.cfg.Shared.Get(ctx, key)
	if err != nil {
		return false, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, 1<<20))
	if err != nil {
		return false, err
	}
	var l model.Layer
	if err := json.Unmarshal(b, &l); err != nil || l.Name != name || l.Version != version || l.Digest != digest {
		return false, fmt.Errorf("%s is not a layer record for %s:%s", key, name, version)
	}
	if err := catalog.ValidateLayerName("name", "version", l.Name, l.Version); err != nil {
		return false, err
	}
	if !l.Public {
		return false, nil // kept to a project of the Corral that published it
	}
	switch l.Kind {
	case model.KindBase, model.KindWorkspace, model.KindToolkit, model.KindSnapshot, model.KindVMImage:
	default:
		return false, fmt.Errorf("%s has unknown kind %q", key, l.Kind)
	}
	if _, err := layers.ParseDigest(l.Digest); err != nil {
		return false, err
	}
	if l.ImageConfig != nil {
		if err := catalog.ValidateImageConfig(l.ImageConfig); err != nil {
			return false, err
		}
	}
	if len(l.Below) > 0 {
		// The parts must be known here (adopting them if need be), as for a local publish.
		below, err := e.CheckBelow(ctx, l.Kind, "", l.Below) // adopted layers belong to the root
		if err != nil {
			return false, err
		}
		l.Below = below
	}
	// Another installation's projects mean nothing here: adopted layers belong to the root
	// project and stay public, usable everywhere in this installation, as where they come from.
	l.Tags, l.Project, l.Private, l.Public = nil, "", false, true
	_, created, err := e.publisher.PublishLayer(ctx, l)
	if err != nil {
		return false, err
	}
	if created {
		// This Corral now has the version too: its own ref keeps the content while it does.
		if err := e.shareVersion(ctx, l); err != nil {
			return true, err
		}
		e.log.Info("layer adopted from the shared catalogue", "layer", name+":"+version, "digest", digest)
	}
	return created, nil
}
