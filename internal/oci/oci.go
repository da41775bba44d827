package oci

import (
	"context"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Defaults for the zero values of Options.
const (
	DefaultRetries    = 3
	DefaultRetryDelay = 500 * time.Millisecond
	DefaultTimeout    = 60 * time.Second
)

// Source says where an image is. Exactly one field is set.
type Source struct {
	// Image is a registry reference: "host[:port]/repo:tag" or "host[:port]/repo@sha256:...". A
	// reference without a host means Docker Hub, one without a tag means "latest".
	Image string

	// Layout is an OCI image layout directory (index.json, blobs/), optionally followed by
	// ":TAG", matched against the org.opencontainers.image.ref.name annotation of the manifests
	// in index.json (or io.containerd.image.name), or by "@sha256:...", a manifest digest listed
	// in index.json. A layout whose index.json lists one manifest needs no selector.
	Layout string

	// DockerArchive is a `docker save` tarball, optionally followed by ":REPO:TAG" choosing one of
	// the images it holds ("images.tar:alpine:3.20"). An archive of one image needs no tag.
	DockerArchive string
}

// Options tune Open and the reads of a Reader. The zero value is usable.
type Options struct {
	// Platform is the "os/arch[/variant]" to pick from a multi-platform image. Default
	// "linux/" + the architecture this binary was built for. Only Linux images are accepted.
	Platform string

	// Insecure allows plain HTTP to the registry (HTTPS is tried first). Registries on localhost,
	// *.local, loopback and private (RFC 1918) addresses may use HTTP without it.
	Insecure bool

	// Auth authenticates to the registry. Nil reads credentials from the default keychain
	// (~/.docker/config.json, $DOCKER_CONFIG, $REGISTRY_AUTH_FILE) and goes anonymous when it
	// has none; authn.Anonymous forces anonymous access.
	Auth authn.Authenticator

	// Retries is how often a transient registry failure (5xx, 429, a timeout, a reset or broken
	// connection) is retried before the call fails with errdefs.ErrUnavailable. Zero means
	// DefaultRetries; a negative value means no retries.
	Retries int

	// RetryDelay is the pause before the first retry; each further pause is three times the one
	// before. Default DefaultRetryDelay.
	RetryDelay time.Duration

	// Timeout bounds how long a registry may take to start answering a request, and how long a
	// layer download may stall. Either counts as a transient failure. Default DefaultTimeout.
	Timeout time.Duration

	// TempDir is where Flatten and WriteGroup keep downloaded layer blobs for the length of the
	// call (at most the compressed size of the layers the call reads). Default os.TempDir().
	TempDir string

	// Progress, if set, is called as layer bytes are read from the source: done and total count
	// the stored (usually compressed) bytes of the layers the call reads, layer is the 0-based
	// index in the image of the layer being read, layers the image's number of layers. It runs
	// on the calling goroutine, about once per MiB and at the end of each layer; keep it quick.
	Progress func(done, total int64, layer, layers int)
}

// Image describes an opened image.
type Image struct {
	// Digest is the manifest digest ("sha256:..."). A docker archive holds no manifest; for it
	// Digest is the config digest, what Docker calls the image ID.
	Digest string

	// Platform is the image's "os/arch[/variant]", from its config.
	Platform string

	// Config is the part of the image config that says how to run it.
	Config Config

	// Layers is the number of layers.
	Layers int

	// Size is the sum of the layers' sizes as stored (compressed, in a registry or layout).
	Size int64
}

// Config is the part of an image config a sandbox uses.
type Config struct {
	Env        []string          // "NAME=value"
	WorkingDir string            // "" means "/"
	User       string            // "user", "uid", "user:group" or "uid:gid"; "" means root
	Entrypoint []string          // may be empty
	Cmd        []string          // arguments to Entrypoint, or the command if it is empty
	Labels     map[string]string // may be nil
}

// Reader reads one opened image. It is immutable and safe for concurrent use.
type Reader struct {
	name   string // the source as the user wrote it, for messages
	img    Image
	layers []layer
	src    blobSource
	opt    Options
}

// Open resolves src and fetches its manifest and config, not the layer bytes. See the package
// doc for the kinds of the errors it returns.
func Open(ctx context.Context, src Source, opt Options) (*Reader, error) {
	opt, want, err := opt.withDefaults()
	if err != nil {
		return nil, err
	}
	set := 0
	for _, s := range []string{src.Image, src.Layout, src.DockerArchive} {
		if s != "" {
			set++
		}
	}
	if set != 1 {
		return nil, errdefs.Invalid("source", "set exactly one of image, layout and docker archive (got %d)", set)
	}
	var r *Reader
	switch {
	case src.Image != "":
		r, err = openRegistry(ctx, src.Image, opt, want)
	case src.Layout != "":
		r, err = openLayout(ctx, src.Layout, opt, want)
	default:
		r, err = openArchive(ctx, src.DockerArchive, opt, want)
	}
	if err != nil {
		return nil, err
	}
	r.opt = opt
	return r, nil
}

// Image describes the image.
func (r *Reader) Image() Image {
	img := r.img
	img.Config.Env = append([]string(nil), img.Config.Env...)
	img.Config.Entrypoint = append([]string(nil), img.Config.Entrypoint...)
	img.Config.Cmd = append([]string(nil), img.Config.Cmd...)
	if img.Config.Labels != nil {
		labels := make(map[string]string, len(img.Config.Labels))
		for k, v := range img.Config.Labels {
			labels[k] = v
		}
		img.Config.Labels = labels
	}
	return img
}

// withDefaults fills in the defaults and parses the platform.
func (o Options) withDefaults() (Options, v1.Platform, error) {
	if o.Platform == "" {
		o.Platform = "linux/" + runtime.GOARCH
	}
	want, err := parsePlatform(o.Platform)
	if err != nil {
		return o, want, err
	}
	switch {
	case o.Retries == 0:
		o.Retries = DefaultRetries
	case o.Retries < 0:
		o.Retries = 0
	}
	if o.RetryDelay <= 0 {
		o.RetryDelay = DefaultRetryDelay
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.TempDir == "" {
		o.TempDir = os.TempDir()
	}
	return o, want, nil
}

// parsePlatform parses "os/arch[/variant]"; only Linux is accepted.
func parsePlatform(s string) (v1.Platform, error) {
	parts := strings.Split(s, "/")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" || (len(parts) == 3 && parts[2] == "") {
		return v1.Platform{}, errdefs.Invalid("platform", "%q is not os/arch[/variant]", s)
	}
	if parts[0] != "linux" {
		return v1.Platform{}, errdefs.Invalid("platform", "%q: Corral runs Linux images only", s)
	}
	p := v1.Platform{OS: parts[0], Architecture: parts[1]}
	if len(parts) == 3 {
		p.Variant = parts[2]
	}
	return p, nil
}

// platformMatches reports whether have (from an index or a config) runs as want. An empty variant
// on either side matches any; arm64's only variant, v8, equals none.
func platformMatches(want, have v1.Platform) bool {
	if want.OS != have.OS || want.Architecture != have.Architecture {
		return false
	}
	wv, hv := want.Variant, have.Variant
	if want.Architecture == "arm64" {
		wv, hv = strings.TrimPrefix(wv, "v8"), strings.TrimPrefix(hv, "v8")
	}
	return wv == "" || hv == "" || wv == hv
}

// platformString formats p as "os/arch[/variant]".
func platformString(p v1.Platform) string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}
