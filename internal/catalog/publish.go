package catalog

import (
	"context"
	"errors"
	"fmt"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/lazyregexp"
	"github.com/corral-dev/corral/internal/model"
)

// MaxBelow bounds how many parts a layer may stack on.
const MaxBelow = 64

// LayerReader reads the layer versions a project sees: Resolver.VisibleLayer, or the servers'
// answer on a cluster's edge (nodeproto.CatalogReader). What at does not see is
// errdefs.ErrNotFound.
type LayerReader interface {
	VisibleLayer(ctx context.Context, at, name, version string) (model.Layer, error)
}

// LayerIn returns the published layer ref (NAME:VERSION or NAME:TAG) names, as lr reads it for
// project at (canonical), checking its kind; field names the request's field in errors.
func LayerIn(ctx context.Context, lr LayerReader, field, ref, kind, at string) (model.Layer, error) {
	name, version, err := ParseLayerRef(field, ref)
	if err != nil {
		return model.Layer{}, err
	}
	l, err := lr.VisibleLayer(ctx, at, name, version)
	if errors.Is(err, errdefs.ErrNotFound) {
		return model.Layer{}, NotPublished(field, ref)
	} else if err != nil {
		return model.Layer{}, err
	}
	if l.Kind != kind {
		return model.Layer{}, errdefs.Invalid(field, "layer %s is a %s layer, not a %s layer", ref, l.Kind, kind)
	}
	return l, nil
}

// CheckBelow validates the versions a new layer of kind, published in project at (canonical),
// stacks on (an image imported in parts): each is published, usable in that project, of the same
// kind, and stacks on nothing itself. It returns them as NAME:VERSION, tags resolved.
func (r *Resolver) CheckBelow(ctx context.Context, kind, at string, below []string) ([]string, error) {
	return CheckBelowIn(ctx, r, kind, at, below)
}

// CheckBelowIn is CheckBelow with the versions read by lr.
func CheckBelowIn(ctx context.Context, lr LayerReader, kind, at string, below []string) ([]string, error) {
	if len(below) > MaxBelow {
		return nil, errdefs.Invalid("below", "at most %d layers, got %d", MaxBelow, len(below))
	}
	var out []string
	for i, ref := range below {
		field := fmt.Sprintf("below[%d]", i)
		l, err := LayerIn(ctx, lr, field, ref, kind, at)
		if err != nil {
			return nil, err
		}
		if len(l.Below) > 0 {
			return nil, errdefs.Invalid(field, "layer %s stacks on other layers itself; name its parts instead", ref)
		}
		out = append(out, l.Name+":"+l.Version)
	}
	return out, nil
}

// CheckPublicParts checks that every part a layer stacks on (NAME:VERSION or NAME:TAG) is
// public, as the layer is to be: a public layer is usable where its parts must be too.
func (r *Resolver) CheckPublicParts(ctx context.Context, field string, below []string) error {
	return checkPublicParts(field, below, func(name, version string) (model.Layer, error) {
		return r.Store.GetLayer(ctx, name, version)
	})
}

// CheckPublicPartsIn is CheckPublicParts with the parts read by lr as project at (the layer's,
// canonical) sees them: a public part is seen everywhere.
func CheckPublicPartsIn(ctx context.Context, lr LayerReader, field, at string, below []string) error {
	return checkPublicParts(field, below, func(name, version string) (model.Layer, error) {
		return lr.VisibleLayer(ctx, at, name, version)
	})
}

func checkPublicParts(field string, below []string, get func(name, version string) (model.Layer, error)) error {
	for i, ref := range below {
		f := fmt.Sprintf("%s[%d]", field, i)
		name, version, err := ParseLayerRef(f, ref)
		if err != nil {
			return err
		}
		part, err := get(name, version)
		if err != nil {
			return err
		}
		if !part.Public {
			return errdefs.Invalid(f, "layer %s is not public: publish the parts first (corral layer publish %s)", ref, ref)
		}
	}
	return nil
}

var digestRE = lazyregexp.New(`^sha256:[0-9a-f]{64}$`)

// CheckRecord checks a layer version a node asks to publish, its blob already stored (a
// cluster's servers, for what an edge imported, snapshotted or built): its name and version,
// kind, digest, settings and image configuration, and the parts it stacks on, each a version
// (not a tag) published, usable in the layer's project and of its kind, and public if the
// layer is. What it stacks on is checked as a record, not as an import's request: a build's
// layers stack on layers that stack on others. Fields are named as in the record ("layer.").
func (r *Resolver) CheckRecord(ctx context.Context, l model.Layer) error {
	if err := ValidateLayerName("layer.name", "layer.version", l.Name, l.Version); err != nil {
		return err
	}
	switch l.Kind {
	case model.KindBase, model.KindWorkspace, model.KindToolkit, model.KindSnapshot, model.KindVMImage:
	default:
		return errdefs.Invalid("layer.kind", "%q is not a layer kind", l.Kind)
	}
	if !digestRE.MatchString(l.Digest) {
		return errdefs.Invalid("layer.digest", "want sha256:<64 lowercase hex digits>, got %q", l.Digest)
	}
	switch {
	case l.Size < 0 || l.Files < 0:
		return errdefs.Invalid("layer.size", "a layer's size and file count are not negative")
	case l.FillRate < -1:
		return errdefs.Invalid("layer.fill_rate", "%d: want bytes per second, 0 for the node's default or -1 for never", l.FillRate)
	case l.Private && l.Public:
		return errdefs.Invalid("layer.public", "a layer cannot be both private and public")
	case (l.Kind == model.KindSnapshot) != (l.Snapshot != nil):
		return errdefs.Invalid("layer.snapshot", "a snapshot layer, and only one, says what it was taken of")
	case l.Kind == model.KindVMImage && len(l.Below) > 0:
		return errdefs.Invalid("layer.below", "a vm-image layer is one disk image; it stacks on nothing")
	case len(l.Below) > MaxBelow:
		return errdefs.Invalid("layer.below", "at most %d layers, got %d", MaxBelow, len(l.Below))
	case len(l.Tags) > 0:
		return errdefs.Invalid("layer.tags", "tags are set through the API, not with a version")
	}
	if l.ImageConfig != nil {
		if err := ValidateImageConfig(l.ImageConfig); err != nil {
			return err
		}
	}
	at, err := iam.ParsePath("layer.project", l.Project)
	if err != nil {
		return err
	}
	for i, ref := range l.Below {
		field := fmt.Sprintf("layer.below[%d]", i)
		name, version, err := ParseLayerRef(field, ref)
		if err != nil {
			return err
		}
		part, err := r.Store.GetLayer(ctx, name, version)
		switch {
		case errors.Is(err, errdefs.ErrNotFound) || err == nil && !LayerVisibleIn(part, at):
			return NotPublished(field, ref)
		case err != nil:
			return err
		case part.Name != name || part.Version != version:
			return errdefs.Invalid(field, "%s is a tag; a record names the versions it stacks on", ref)
		case part.Kind != l.Kind:
			return errdefs.Invalid(field, "layer %s is a %s layer, not a %s layer", ref, part.Kind, l.Kind)
		case l.Public && !part.Public:
			return errdefs.Invalid(field, "layer %s is not public, and a public layer's parts must be", ref)
		}
	}
	return nil
}
