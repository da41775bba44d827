package oci

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Size limits on the JSON documents of an image. Real manifests are a few KiB; configs with a
// long history reach a few hundred KiB.
const (
	maxManifest = 4 << 20
	maxConfig   = 16 << 20
	maxNesting  = 3 // indexes within indexes
)

// layer is one layer of an opened image.
type layer struct {
	index     int
	mediaType types.MediaType
	digest    v1.Hash // of the stored bytes; zero in a docker archive, which has no blob digests
	diffID    v1.Hash // of the uncompressed tar, from the config
	size      int64   // stored bytes
}

// manifestStore is what a registry and a layout have in common: manifests and blobs by digest.
type manifestStore interface {
	// manifest returns the manifest d names and its media type as the store has it ("" if the
	// store does not know), checked against d's digest.
	manifest(ctx context.Context, d v1.Descriptor) ([]byte, types.MediaType, error)
	// config returns the config blob d names, checked against d's digest.
	config(ctx context.Context, d v1.Descriptor) ([]byte, error)
}

// configFile is the part of an image config this package reads. Unknown and malformed fields
// elsewhere in the document (history, created) do not matter.
type configFile struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Variant      string `json:"variant"`
	RootFS       struct {
		Type    string    `json:"type"`
		DiffIDs []v1.Hash `json:"diff_ids"`
	} `json:"rootfs"`
	Config struct {
		Env        []string          `json:"Env"`
		WorkingDir string            `json:"WorkingDir"`
		User       string            `json:"User"`
		Entrypoint []string          `json:"Entrypoint"`
		Cmd        []string          `json:"Cmd"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
}

// resolve follows top (a manifest or an index, as fetched) to the image manifest for want, fetches
// the config and checks both. field and name say what the user asked for, for messages.
func resolve(ctx context.Context, st manifestStore, field, name string, raw []byte, declared types.MediaType, digest v1.Hash, want v1.Platform) (Image, []layer, error) {
	for depth := 0; ; depth++ {
		mt, err := manifestType(raw, declared)
		if err != nil {
			return Image{}, nil, errdefs.Invalid(field, "%s: %v", name, err)
		}
		switch mt {
		case types.OCIManifestSchema1, types.DockerManifestSchema2:
			return imageFromManifest(ctx, st, field, name, raw, digest, want)
		case types.OCIImageIndex, types.DockerManifestList:
		case types.DockerManifestSchema1, types.DockerManifestSchema1Signed:
			return Image{}, nil, errdefs.Invalid(field, "%s uses Docker's schema 1 manifest format, which is not supported; push it again with a current Docker", name)
		default:
			return Image{}, nil, errdefs.Invalid(field, "%s is %s, not a container image", name, describeType(mt))
		}
		if depth == maxNesting {
			return Image{}, nil, errdefs.Invalid(field, "%s: indexes nested more than %d deep", name, maxNesting)
		}
		idx, err := v1.ParseIndexManifest(bytes.NewReader(raw))
		if err != nil {
			return Image{}, nil, errdefs.Invalid(field, "%s: malformed image index: %v", name, err)
		}
		d, err := choosePlatform(name, idx, want)
		if err != nil {
			return Image{}, nil, err
		}
		if raw, declared, err = st.manifest(ctx, d); err != nil {
			return Image{}, nil, err
		}
		if declared == "" {
			declared = d.MediaType
		}
		digest = d.Digest
	}
}

// manifestType says what raw is. The document's own mediaType field wins over the type the store
// declared (registries and static file servers get Content-Type wrong).
func manifestType(raw []byte, declared types.MediaType) (types.MediaType, error) {
	var p struct {
		SchemaVersion int             `json:"schemaVersion"`
		MediaType     types.MediaType `json:"mediaType"`
		Manifests     json.RawMessage `json:"manifests"`
		Config        json.RawMessage `json:"config"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return "", fmt.Errorf("manifest is not valid JSON: %v", err)
	}
	switch {
	case p.SchemaVersion == 1:
		return types.DockerManifestSchema1, nil
	case p.MediaType != "":
		return p.MediaType, nil
	case declared != "" && declared != "application/json" && declared != "application/octet-stream" && declared != "text/plain":
		return declared, nil
	case p.Manifests != nil:
		return types.OCIImageIndex, nil
	case p.Config != nil:
		return types.OCIManifestSchema1, nil
	}
	return "", fmt.Errorf("manifest has no media type and is neither an image manifest nor an index")
}

// describeType names a media type for a user who expected an image.
func describeType(mt types.MediaType) string {
	s := string(mt)
	switch {
	case strings.Contains(s, "helm"):
		return fmt.Sprintf("a Helm chart (%s)", s)
	case s == "":
		return "an artifact with no media type"
	}
	return fmt.Sprintf("an artifact of type %s", s)
}

// choosePlatform picks want's manifest from an index: an exact match first, then one whose
// variant is unspecified on either side, then a lone manifest without a platform (its config is
// checked later). Attestation manifests are skipped.
func choosePlatform(name string, idx *v1.IndexManifest, want v1.Platform) (v1.Descriptor, error) {
	var have []string
	var unknown []v1.Descriptor
	var loose *v1.Descriptor
	for i := range idx.Manifests {
		d := &idx.Manifests[i]
		if d.Annotations["vnd.docker.reference.type"] == "attestation-manifest" {
			continue
		}
		if d.Platform == nil {
			unknown = append(unknown, *d)
			continue
		}
		p := *d.Platform
		if p.OS == "unknown" {
			continue
		}
		if platformMatches(want, p) {
			if p.Variant == want.Variant {
				return *d, nil
			}
			if loose == nil {
				loose = d
			}
		}
		have = append(have, platformString(p))
	}
	switch {
	case loose != nil:
		return *loose, nil
	case len(have) == 0 && len(unknown) == 1:
		return unknown[0], nil
	case len(have) == 0:
		return v1.Descriptor{}, errdefs.Invalid("platform", "%s is an index with no image for %s", name, platformString(want))
	}
	return v1.Descriptor{}, errdefs.Invalid("platform", "%s has no image for %s; it has %s", name, platformString(want), strings.Join(have, ", "))
}

// imageFromManifest checks an image manifest, fetches and checks its config.
func imageFromManifest(ctx context.Context, st manifestStore, field, name string, raw []byte, digest v1.Hash, want v1.Platform) (Image, []layer, error) {
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return Image{}, nil, errdefs.Invalid(field, "%s: malformed image manifest: %v", name, err)
	}
	switch {
	case m.Config.MediaType == types.OCIConfigJSON || m.Config.MediaType == types.DockerConfigJSON:
	case strings.Contains(string(m.Config.MediaType), "helm"):
		return Image{}, nil, errdefs.Invalid(field, "%s is a Helm chart (config %s), not a container image", name, m.Config.MediaType)
	default:
		return Image{}, nil, errdefs.Invalid(field, "%s is not a container image: its config has media type %q", name, m.Config.MediaType)
	}
	if m.Config.Size < 0 || m.Config.Size > maxConfig {
		return Image{}, nil, errdefs.Invalid(field, "%s: config size %d is out of range (limit %d)", name, m.Config.Size, maxConfig)
	}
	layers := make([]layer, len(m.Layers))
	var size int64
	for i, d := range m.Layers {
		if err := checkLayerType(d.MediaType); err != nil {
			return Image{}, nil, errdefs.Invalid(field, "%s: layer %d (%s): %v", name, i, d.Digest, err)
		}
		if d.Size < 0 {
			return Image{}, nil, errdefs.Invalid(field, "%s: layer %d has negative size %d", name, i, d.Size)
		}
		layers[i] = layer{index: i, mediaType: d.MediaType, digest: d.Digest, size: d.Size}
		size += d.Size
	}
	rawCfg, err := st.config(ctx, m.Config)
	if err != nil {
		return Image{}, nil, err
	}
	img, err := imageFromConfig(field, name, rawCfg, layers, want)
	if err != nil {
		return Image{}, nil, err
	}
	img.Digest = digest.String()
	img.Size = size
	return img, layers, nil
}

// checkLayerType accepts the media types of tar layers (uncompressed, gzip or zstd).
func checkLayerType(mt types.MediaType) error {
	switch mt {
	case types.OCILayer, types.OCILayerZStd, types.OCIUncompressedLayer, types.OCIRestrictedLayer,
		types.OCIUncompressedRestrictedLayer, types.DockerLayer, types.DockerUncompressedLayer,
		"application/vnd.oci.image.layer.nondistributable.v1.tar+zstd":
		return nil
	case types.DockerForeignLayer:
		return fmt.Errorf("foreign layer (a Windows base layer hosted elsewhere) is not supported")
	}
	return fmt.Errorf("media type %q is not a tar layer", mt)
}

// imageFromConfig parses a config and fills in the layers' diff_ids. The caller fills in Digest
// and Size.
func imageFromConfig(field, name string, raw []byte, layers []layer, want v1.Platform) (Image, error) {
	var cfg configFile
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return Image{}, errdefs.Invalid(field, "%s: malformed image config: %v", name, err)
	}
	have := v1.Platform{OS: cfg.OS, Architecture: cfg.Architecture, Variant: cfg.Variant}
	if have.OS == "" {
		have.OS = "linux" // older builders left it out; Windows images always set it
	}
	if have.OS != "linux" {
		return Image{}, errdefs.Invalid(field, "%s is a %s image; Corral runs Linux images", name, platformString(have))
	}
	if have.Architecture == "" {
		have.Architecture = want.Architecture
	}
	if !platformMatches(want, have) {
		return Image{}, errdefs.Invalid("platform", "%s is a %s image, not %s", name, platformString(have), platformString(want))
	}
	if len(cfg.RootFS.DiffIDs) != len(layers) {
		return Image{}, errdefs.Invalid(field, "%s: the config lists %d layer diff_ids but the manifest %d layers", name, len(cfg.RootFS.DiffIDs), len(layers))
	}
	for i := range layers {
		layers[i].diffID = cfg.RootFS.DiffIDs[i]
	}
	c := cfg.Config
	return Image{
		Platform: platformString(have),
		Config: Config{Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint,
			Cmd: c.Cmd, Labels: c.Labels},
		Layers: len(layers),
	}, nil
}

// readVerified reads at most limit bytes of r and checks them against want.
func readVerified(r io.Reader, want v1.Hash, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("larger than the limit of %d bytes", limit)
	}
	if err := checkDigest(b, want); err != nil {
		return nil, err
	}
	return b, nil
}

// checkDigest checks b against want (sha256 only).
func checkDigest(b []byte, want v1.Hash) error {
	if want.Algorithm != "sha256" {
		return fmt.Errorf("unsupported digest algorithm %q", want.Algorithm)
	}
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != want.Hex {
		return fmt.Errorf("%w: content has digest sha256:%s, want %s", errDigest, got, want)
	}
	return nil
}

// errDigest marks content that does not match its digest; callers turn it into errdefs.ErrInvalid.
var errDigest = errors.New("digest mismatch")
