package oci

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/corral-dev/corral/internal/errdefs"
)

// registrySource reads an image from a registry.
type registrySource struct {
	name   string // the reference as the user wrote it
	ref    name.Reference
	puller *remote.Puller // authenticates once per repository and reuses the token
	auth   bool           // the caller passed credentials
}

// openRegistry resolves a registry reference.
func openRegistry(ctx context.Context, s string, opt Options, want v1.Platform) (*Reader, error) {
	var nopts []name.Option
	if opt.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	ref, err := name.ParseReference(s, nopts...)
	if err != nil {
		return nil, errdefs.Invalid("image", "%q is not an image reference: %v", s, err)
	}
	base, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		base = &http.Transport{}
	}
	ropts := []remote.Option{
		remote.WithTransport(&answerTimeout{next: base.Clone(), d: opt.Timeout}),
		remote.WithPlatform(want),
		remote.WithUserAgent("corral"),
		// Steps counts attempts, not retries.
		remote.WithRetryBackoff(remote.Backoff{Duration: opt.RetryDelay, Factor: 3, Jitter: 0.1, Steps: opt.Retries + 1}),
	}
	if opt.Auth != nil {
		ropts = append(ropts, remote.WithAuth(opt.Auth))
	} else {
		ropts = append(ropts, remote.WithAuthFromKeychain(authn.DefaultKeychain))
	}
	puller, err := remote.NewPuller(ropts...)
	if err != nil {
		return nil, fmt.Errorf("set up registry client: %w", err)
	}
	rs := &registrySource{name: s, ref: ref, puller: puller, auth: opt.Auth != nil && opt.Auth != authn.Anonymous}
	desc, err := puller.Get(ctx, ref)
	if err != nil {
		return nil, rs.fail(ctx, "image "+s, err)
	}
	if len(desc.Manifest) > maxManifest {
		return nil, errdefs.Invalid("image", "%s: manifest of %d bytes is over the limit of %d", s, len(desc.Manifest), maxManifest)
	}
	// The digest of what was served, not what the registry says it is.
	sum := sha256.Sum256(desc.Manifest)
	top := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
	if d, ok := ref.(name.Digest); ok && d.DigestStr() != top.String() {
		return nil, errdefs.Invalid("image", "%s: the registry served a manifest with digest %s", s, top)
	}
	img, layers, err := resolve(ctx, rs, "image", s, desc.Manifest, desc.MediaType, top, want)
	if err != nil {
		return nil, err
	}
	return &Reader{name: s, img: img, layers: layers, src: rs}, nil
}

func (s *registrySource) manifest(ctx context.Context, d v1.Descriptor) ([]byte, types.MediaType, error) {
	desc, err := s.puller.Get(ctx, s.ref.Context().Digest(d.Digest.String()))
	if err != nil {
		return nil, "", s.fail(ctx, fmt.Sprintf("manifest %s of image %s", d.Digest, s.name), err)
	}
	if len(desc.Manifest) > maxManifest {
		return nil, "", errdefs.Invalid("image", "%s: manifest %s of %d bytes is over the limit of %d", s.name, d.Digest, len(desc.Manifest), maxManifest)
	}
	if err := checkDigest(desc.Manifest, d.Digest); err != nil {
		return nil, "", errdefs.Invalid("image", "%s: manifest %s: %v", s.name, d.Digest, err)
	}
	return desc.Manifest, desc.MediaType, nil
}

func (s *registrySource) config(ctx context.Context, d v1.Descriptor) ([]byte, error) {
	what := fmt.Sprintf("config %s of image %s", d.Digest, s.name)
	l, err := s.puller.Layer(ctx, s.ref.Context().Digest(d.Digest.String()))
	if err != nil {
		return nil, s.fail(ctx, what, err)
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, s.fail(ctx, what, err)
	}
	defer rc.Close()
	b, err := readVerified(rc, d.Digest, maxConfig)
	if err != nil {
		return nil, s.fail(ctx, what, err)
	}
	return b, nil
}

func (s *registrySource) openLayer(ctx context.Context, l *layer) (io.ReadCloser, error) {
	rl, err := s.puller.Layer(ctx, s.ref.Context().Digest(l.digest.String()))
	if err != nil {
		return nil, err
	}
	return rl.Compressed()
}

func (s *registrySource) remote() bool { return true }

func (s *registrySource) describe(l *layer) string {
	return fmt.Sprintf("layer %d (%s) of image %s", l.index, l.digest, s.name)
}

// fail gives a registry error its kind and a message that names what was being fetched (what)
// and the registry's own words.
func (s *registrySource) fail(ctx context.Context, what string, err error) error {
	host := s.ref.Context().RegistryStr()
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(cerr, context.DeadlineExceeded) {
			return fmt.Errorf("%s: registry %s did not answer in time: %w: %w", what, host, errdefs.ErrUnavailable, cerr)
		}
		return fmt.Errorf("%s: %w", what, cerr)
	}
	var te *transport.Error
	if errors.As(err, &te) {
		msg := registryMessage(te)
		switch {
		case te.StatusCode == http.StatusUnauthorized || hasCode(te, transport.UnauthorizedErrorCode):
			if s.auth {
				return fmt.Errorf("%s: registry %s refused the credentials (%s): %w", what, host, msg, errdefs.ErrUnauthorized)
			}
			return fmt.Errorf("%s: registry %s requires authentication (%s); log in with `docker login %s` or pass credentials: %w", what, host, msg, host, errdefs.ErrUnauthorized)
		case te.StatusCode == http.StatusForbidden || hasCode(te, transport.DeniedErrorCode):
			return fmt.Errorf("%s: registry %s denied access (%s): %w", what, host, msg, errdefs.ErrDenied)
		case te.StatusCode == http.StatusNotFound || hasCode(te, transport.ManifestUnknownErrorCode) ||
			hasCode(te, transport.NameUnknownErrorCode) || hasCode(te, transport.BlobUnknownErrorCode):
			return errdefs.NotFound("%s not found in the registry", what)
		case te.StatusCode == http.StatusTooManyRequests || hasCode(te, transport.TooManyRequestsErrorCode):
			return fmt.Errorf("%s: registry %s is rate-limiting requests (%s); try again later: %w", what, host, msg, errdefs.ErrUnavailable)
		case te.StatusCode >= 500:
			return fmt.Errorf("%s: registry %s failed (%s): %w", what, host, msg, errdefs.ErrUnavailable)
		}
		return errdefs.Invalid("image", "%s: registry %s refused the request (%s)", what, host, msg)
	}
	// go-containerregistry's own checks of what it fetched; its error types are internal.
	if errors.Is(err, errDigest) || strings.Contains(err.Error(), "error verifying") || strings.Contains(err.Error(), "does not match requested digest") {
		return errdefs.Invalid("image", "%s: %v", what, err)
	}
	if isNetwork(err) {
		return fmt.Errorf("%s: cannot reach registry %s: %v: %w", what, host, err, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// registryMessage is the registry's explanation of an error, short.
func registryMessage(te *transport.Error) string {
	var parts []string
	for _, d := range te.Errors {
		p := string(d.Code)
		if d.Message != "" {
			p += ": " + d.Message
		}
		parts = append(parts, p)
	}
	msg := strings.Join(parts, "; ")
	if msg == "" {
		msg = fmt.Sprintf("HTTP %d %s", te.StatusCode, http.StatusText(te.StatusCode))
	}
	if len(msg) > 300 {
		msg = msg[:300] + "..."
	}
	return msg
}

func hasCode(te *transport.Error, code transport.ErrorCode) bool {
	for _, d := range te.Errors {
		if d.Code == code {
			return true
		}
	}
	return false
}

// isNetwork reports whether err is a failure to talk to the registry rather than an answer.
func isNetwork(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, errStalled)
}

// answerTimeout fails a request whose response does not start within d with errNoAnswer, which
// go-containerregistry's retry transport (wrapped around this one) retries. http.Transport's own
// ResponseHeaderTimeout is not used: its error counts as context.DeadlineExceeded, which is never
// retried.
type answerTimeout struct {
	next http.RoundTripper
	d    time.Duration
}

// RoundTrip implements http.RoundTripper.
func (t *answerTimeout) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(req.Context())
	timer := time.AfterFunc(t.d, cancel)
	resp, err := t.next.RoundTrip(req.WithContext(ctx))
	if !timer.Stop() && req.Context().Err() == nil {
		if err == nil {
			resp.Body.Close()
		}
		cancel()
		return nil, &noAnswerError{host: req.URL.Host, d: t.d}
	}
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// noAnswerError is a request that got no response in time. It is temporary, so retried.
type noAnswerError struct {
	host string
	d    time.Duration
}

// Error implements error.
func (e *noAnswerError) Error() string { return fmt.Sprintf("%s sent no response for %v", e.host, e.d) }

// Timeout says this is a timeout (net.Error).
func (e *noAnswerError) Timeout() bool { return true }

// Temporary says a retry may succeed.
func (e *noAnswerError) Temporary() bool { return true }

// cancelOnClose releases a request's context with its response body.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

// Close closes the body and releases the request's context.
func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}
