package oci

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/corral-dev/corral/internal/doccheck"
	"github.com/corral-dev/corral/internal/errdefs"
)

func TestDocs(t *testing.T) { doccheck.Exported(t, ".") }

func TestRegistryOpenAndFlatten(t *testing.T) {
	host := newRegistry(t, nil)
	img := imageOf(t, baseLayers(t)...)
	ref := host + "/corral/base:v1"
	push(t, ref, img, nil)

	var calls []int64
	opt := fast()
	opt.Progress = func(done, total int64, layer, layers int) {
		if layers != 3 {
			t.Errorf("Progress layers = %d, want 3", layers)
		}
		calls = append(calls, done, total)
	}
	r, err := Open(context.Background(), Source{Image: ref}, opt)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	got := r.Image()
	var size int64
	ls, _ := img.Layers()
	for _, l := range ls {
		s, _ := l.Size()
		size += s
	}
	want := Image{
		Digest:   digestOf(t, img),
		Platform: "linux/" + runtimeArch(),
		Config: Config{Env: testConfig.Env, WorkingDir: "/work", User: "1000:1000",
			Entrypoint: testConfig.Entrypoint, Cmd: testConfig.Cmd, Labels: testConfig.Labels},
		Layers: 3,
		Size:   size,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Image() = %+v\nwant %+v", got, want)
	}
	diffTree(t, treeOf(t, flatten(t, r)), baseTree)
	if n := len(calls); n < 2 || calls[n-2] != size || calls[n-1] != size {
		t.Errorf("Progress calls (done, total...) = %v; want the last to be %d, %d", calls, size, size)
	}

	// By digest, too.
	r, err = Open(context.Background(), Source{Image: host + "/corral/base@" + want.Digest}, fast())
	if err != nil {
		t.Fatalf("Open by digest: %v", err)
	}
	if r.Image().Digest != want.Digest {
		t.Errorf("Digest = %s, want %s", r.Image().Digest, want.Digest)
	}
}

func runtimeArch() string {
	p, _, _ := Options{}.withDefaults()
	return strings.TrimPrefix(p.Platform, "linux/")
}

func TestRegistryNotFound(t *testing.T) {
	host := newRegistry(t, nil)
	push(t, host+"/corral/base:v1", imageOf(t, layerOf(t, file("a", "a"))), nil)
	for _, ref := range []string{host + "/corral/base:v2", host + "/corral/nope:v1"} {
		_, err := Open(context.Background(), Source{Image: ref}, fast())
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("Open(%s) = %v, want ErrNotFound", ref, err)
		}
		if want := "image " + ref + " not found in the registry"; !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	_, err := Open(context.Background(), Source{Image: "Not A Reference"}, fast())
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Open(bad reference) = %v, want ErrInvalid", err)
	}
}

// basicAuth requires user:pass, as a registry with htpasswd does.
func basicAuth(user, pass string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u, p, ok := r.BasicAuth()
			if !ok || u != user || p != pass {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				w.Write([]byte(`{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`))
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

func TestRegistryAuth(t *testing.T) {
	host := newRegistry(t, basicAuth("alice", "s3cret"))
	ref := host + "/private/img:v1"
	good := &authn.Basic{Username: "alice", Password: "s3cret"}
	push(t, ref, imageOf(t, baseLayers(t)...), good)

	_, err := Open(context.Background(), Source{Image: ref}, fast())
	if !errors.Is(err, errdefs.ErrUnauthorized) || !strings.Contains(err.Error(), "requires authentication") ||
		!strings.Contains(err.Error(), "authentication required") {
		t.Errorf("anonymous Open = %v, want ErrUnauthorized saying authentication is required, with the registry's message", err)
	}

	opt := fast()
	opt.Auth = &authn.Basic{Username: "alice", Password: "wrong"}
	_, err = Open(context.Background(), Source{Image: ref}, opt)
	if !errors.Is(err, errdefs.ErrUnauthorized) || !strings.Contains(err.Error(), "refused the credentials") {
		t.Errorf("Open with a wrong password = %v, want ErrUnauthorized saying the credentials were refused", err)
	}

	opt.Auth = good
	r, err := Open(context.Background(), Source{Image: ref}, opt)
	if err != nil {
		t.Fatalf("Open with credentials: %v", err)
	}
	diffTree(t, treeOf(t, flatten(t, r)), baseTree)
}

func TestRegistryDenied(t *testing.T) {
	host := newRegistry(t, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/manifests/") {
				w.WriteHeader(http.StatusForbidden)
				w.Write([]byte(`{"errors":[{"code":"DENIED","message":"no pull for you"}]}`))
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	ref := host + "/corral/base:v1"
	push(t, ref, imageOf(t, layerOf(t, file("a", "a"))), nil)
	_, err := Open(context.Background(), Source{Image: ref}, fast())
	if !errors.Is(err, errdefs.ErrDenied) || !strings.Contains(err.Error(), "no pull for you") {
		t.Errorf("Open = %v, want ErrDenied with the registry's message", err)
	}
}

// failing answers 500 to the first n requests whose path contains part, and counts them all.
type failing struct {
	part     string
	n        int32
	attempts atomic.Int32
}

func (f *failing) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, f.part) {
			if f.attempts.Add(1) <= f.n {
				http.Error(w, "boom", http.StatusInternalServerError)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func TestRegistryRetries(t *testing.T) {
	t.Run("manifest 500 then success", func(t *testing.T) {
		f := &failing{part: "/manifests/", n: 1}
		host := newRegistry(t, f.wrap)
		ref := host + "/corral/base:v1"
		push(t, ref, imageOf(t, layerOf(t, file("a", "a"))), nil)
		f.attempts.Store(0)
		if _, err := Open(context.Background(), Source{Image: ref}, fast()); err != nil {
			t.Fatalf("Open: %v", err)
		}
		if got := f.attempts.Load(); got != 2 {
			t.Errorf("manifest requests = %d, want 2", got)
		}
	})
	t.Run("layer 500 twice then success", func(t *testing.T) {
		img := imageOf(t, layerOf(t, file("a", "a")))
		ls, _ := img.Layers()
		d, _ := ls[0].Digest()
		f := &failing{part: "/blobs/" + d.String(), n: 2}
		host := newRegistry(t, f.wrap)
		ref := host + "/corral/base:v1"
		push(t, ref, img, nil)
		f.attempts.Store(0)
		r, err := Open(context.Background(), Source{Image: ref}, fast())
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		diffTree(t, treeOf(t, flatten(t, r)), []string{"a file a"})
		if got := f.attempts.Load(); got != 3 {
			t.Errorf("layer requests = %d, want 3", got)
		}
	})
	t.Run("500 until the retries run out", func(t *testing.T) {
		f := &failing{part: "/manifests/", n: 1000}
		host := newRegistry(t, f.wrap)
		ref := host + "/corral/base:v1"
		push(t, ref, imageOf(t, layerOf(t, file("a", "a"))), nil)
		f.attempts.Store(0)
		opt := fast()
		opt.Retries = 2
		_, err := Open(context.Background(), Source{Image: ref}, opt)
		if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "500") {
			t.Errorf("Open = %v, want ErrUnavailable naming the status", err)
		}
		if got := f.attempts.Load(); got != 3 {
			t.Errorf("manifest requests = %d, want 3 (1 + 2 retries)", got)
		}
	})
}

// hanging blocks requests whose path contains part until the client gives up, and counts them.
type hanging struct {
	part     string
	attempts atomic.Int32
}

func (h *hanging) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, h.part) {
			h.attempts.Add(1)
			<-r.Context().Done()
			return
		}
		next.ServeHTTP(w, r)
	})
}

func TestRegistryTimeouts(t *testing.T) {
	h := &hanging{part: "/manifests/"}
	host := newRegistry(t, h.wrap)
	ref := host + "/corral/base:v1"

	t.Run("context deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err := Open(ctx, Source{Image: ref}, fast())
		if !errors.Is(err, errdefs.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Open = %v, want ErrUnavailable and DeadlineExceeded", err)
		}
	})
	t.Run("per-request timeout, retried", func(t *testing.T) {
		h.attempts.Store(0)
		opt := fast()
		opt.Timeout = 100 * time.Millisecond
		opt.Retries = 1
		_, err := Open(context.Background(), Source{Image: ref}, opt)
		if !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("Open = %v, want ErrUnavailable", err)
		}
		if got := h.attempts.Load(); got != 2 {
			t.Errorf("manifest requests = %d, want 2 (1 + 1 retry)", got)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		_, err := Open(ctx, Source{Image: ref}, fast())
		if !errors.Is(err, context.Canceled) || errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("Open = %v, want context.Canceled and no kind", err)
		}
	})
}

// brokenBlob serves the first request for blob digest badly (how is "stall": half of it, then
// nothing; "reset": half of it, then the connection drops) and later ones in full.
type brokenBlob struct {
	digest   string
	how      string
	attempts atomic.Int32
	once     sync.Once
}

func (b *brokenBlob) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+b.digest) {
			next.ServeHTTP(w, r)
			return
		}
		b.attempts.Add(1)
		first := false
		b.once.Do(func() { first = true })
		if !first {
			next.ServeHTTP(w, r)
			return
		}
		rec := &recorder{header: http.Header{}}
		next.ServeHTTP(rec, r)
		maps.Copy(w.Header(), rec.header)
		w.WriteHeader(http.StatusOK)
		w.Write(rec.body.Bytes()[:rec.body.Len()/2])
		w.(http.Flusher).Flush()
		if b.how == "reset" {
			panic(http.ErrAbortHandler)
		}
		<-r.Context().Done()
	})
}

type recorder struct {
	header http.Header
	body   bytes.Buffer
	code   int
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *recorder) WriteHeader(code int)        { r.code = code }

func TestRegistryBrokenDownloadRetried(t *testing.T) {
	for _, how := range []string{"stall", "reset"} {
		t.Run(how, func(t *testing.T) {
			big := strings.Repeat("0123456789abcdef", 64<<10) // 1 MiB, so the half is a real transfer
			img := imageOf(t, layerOf(t, file("big", big)), layerOf(t, file("small", "s")))
			ls, _ := img.Layers()
			d, _ := ls[0].Digest()
			b := &brokenBlob{digest: d.String(), how: how}
			host := newRegistry(t, b.wrap)
			ref := host + "/corral/big:v1"
			push(t, ref, img, nil)
			b.attempts.Store(0)
			opt := fast()
			opt.Timeout = 300 * time.Millisecond
			r, err := Open(context.Background(), Source{Image: ref}, opt)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			diffTree(t, treeOf(t, flatten(t, r)), []string{"big file " + big, "small file s"})
			if got := b.attempts.Load(); got != 2 {
				t.Errorf("layer requests = %d, want 2", got)
			}
		})
	}
}

// corruptBlob flips a byte of every response for blob digest.
func corruptBlob(digest string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+digest) {
				next.ServeHTTP(w, r)
				return
			}
			rec := &recorder{header: http.Header{}}
			next.ServeHTTP(rec, r)
			b := rec.body.Bytes()
			b[len(b)/2] ^= 0xff
			maps.Copy(w.Header(), rec.header)
			w.WriteHeader(http.StatusOK)
			w.Write(b)
		})
	}
}

func TestRegistryDigestMismatch(t *testing.T) {
	img := imageOf(t, layerOf(t, file("a", strings.Repeat("a", 4096))))
	ls, _ := img.Layers()
	ld, _ := ls[0].Digest()
	cd, _ := img.ConfigName()
	for what, digest := range map[string]string{"layer": ld.String(), "config": cd.String()} {
		t.Run(what, func(t *testing.T) {
			host := newRegistry(t, corruptBlob(digest))
			ref := host + "/corral/base:v1"
			push(t, ref, img, nil)
			r, err := Open(context.Background(), Source{Image: ref}, fast())
			if err == nil {
				err = r.Flatten(context.Background(), &bytes.Buffer{})
			}
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), digest) {
				t.Errorf("got %v, want ErrInvalid naming %s", err, digest)
			}
		})
	}
}

func TestRegistryUnsupported(t *testing.T) {
	host := newRegistry(t, nil)

	helm := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	helm = mutate.ConfigMediaType(helm, "application/vnd.cncf.helm.config.v1+json")
	helm, err := mutate.Append(helm, mutate.Addendum{Layer: layerOf(t, file("Chart.yaml", "name: x")),
		MediaType: "application/vnd.cncf.helm.chart.content.v1.tar+gzip"})
	if err != nil {
		t.Fatal(err)
	}
	push(t, host+"/charts/x:1.0", helm, nil)

	push(t, host+"/win/x:1", imageFor(t, "windows", "amd64", layerOf(t, file("a", "a"))), nil)

	other := "arm64"
	if runtimeArch() == "arm64" {
		other = "amd64"
	}
	push(t, host+"/other/x:1", imageFor(t, "linux", other, layerOf(t, file("a", "a"))), nil)

	for _, tc := range []struct {
		ref, want string
	}{
		{host + "/charts/x:1.0", "Helm chart"},
		{host + "/win/x:1", "windows/amd64 image"},
		{host + "/other/x:1", "linux/" + other + " image, not linux/" + runtimeArch()},
	} {
		_, err := Open(context.Background(), Source{Image: tc.ref}, fast())
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%s) = %v, want ErrInvalid saying %q", tc.ref, err, tc.want)
		}
	}
}

func TestRegistryIndex(t *testing.T) {
	host := newRegistry(t, nil)
	amd := imageFor(t, "linux", "amd64", layerOf(t, file("arch", "amd64")))
	arm := imageFor(t, "linux", "arm64", layerOf(t, file("arch", "arm64")))
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}}},
	)
	ref := host + "/multi/x:1"
	if err := remoteWriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		platform string
		want     v1.Image
	}{
		{"linux/amd64", amd},
		{"linux/arm64", arm},
		{"linux/arm64/v8", arm},
	} {
		opt := fast()
		opt.Platform = tc.platform
		r, err := Open(context.Background(), Source{Image: ref}, opt)
		if err != nil {
			t.Fatalf("Open for %s: %v", tc.platform, err)
		}
		if got, want := r.Image().Digest, digestOf(t, tc.want); got != want {
			t.Errorf("%s: Digest = %s, want %s", tc.platform, got, want)
		}
		arch := strings.Split(tc.platform, "/")[1]
		diffTree(t, treeOf(t, flatten(t, r)), []string{"arch file " + arch})
	}

	opt := fast()
	opt.Platform = "linux/s390x"
	_, err := Open(context.Background(), Source{Image: ref}, opt)
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "no image for linux/s390x; it has linux/amd64, linux/arm64/v8") {
		t.Errorf("Open for s390x = %v, want ErrInvalid listing the platforms", err)
	}
	opt.Platform = "windows/amd64"
	if _, err := Open(context.Background(), Source{Image: ref}, opt); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Open for windows = %v, want ErrInvalid", err)
	}
}

func TestSourceValidation(t *testing.T) {
	for _, tc := range []struct {
		src Source
		opt Options
	}{
		{Source{}, Options{}},
		{Source{Image: "a", Layout: "b"}, Options{}},
		{Source{Image: "a"}, Options{Platform: "amd64"}},
		{Source{Image: "a"}, Options{Platform: "windows/amd64"}},
	} {
		if _, err := Open(context.Background(), tc.src, tc.opt); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Open(%+v, %+v) = %v, want ErrInvalid", tc.src, tc.opt, err)
		}
	}
}
