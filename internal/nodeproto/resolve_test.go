package nodeproto

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/model"
)

// TestForwardedResolution: a resolution a replica forwards with a create is taken for that very
// request only, without a call; another request, an fncall container, or a header too large or
// not decodable is asked for on the channel.
func TestForwardedResolution(t *testing.T) {
	var calls atomic.Int32
	srv, _ := replica(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"request":{"base":"asked:1"},"tier":"container","digests":["sha256:asked"]}`))
	})
	s, err := NewServers([]string{srv.URL}, insecure)
	if err != nil {
		t.Fatal(err)
	}
	req := model.CreateRequest{Project: "p", Base: "base:latest"}
	res := &catalog.Resolution{Request: model.CreateRequest{Project: "p", Base: "base:1"}, Tier: "container", Digests: []string{"sha256:forwarded"}}
	h := http.Header{}
	SetResolution(h, req, res)
	f := ResolutionOf(h)
	if f == nil {
		t.Fatal("the forwarded resolution did not decode")
	}
	ctx := WithResolution(context.Background(), f)
	got, err := s.Catalog().Resolve(ctx, req, false)
	if err != nil || !slices.Equal(got.Digests, []string{"sha256:forwarded"}) || calls.Load() != 0 {
		t.Errorf("the forwarded request: %+v, %v, %d calls; want the forwarded resolution, no call", got, err, calls.Load())
	}
	other := req
	other.Labels = map[string]string{"a": "b"}
	for name, c := range map[string]struct {
		ctx   context.Context
		req   model.CreateRequest
		calls bool
	}{
		"another request":     {ctx, other, false},
		"an fncall container": {ctx, req, true},
		"no forwarded one":    {context.Background(), req, false},
	} {
		before := calls.Load()
		got, err := s.Catalog().Resolve(c.ctx, c.req, c.calls)
		if err != nil || !slices.Equal(got.Digests, []string{"sha256:asked"}) || calls.Load() != before+1 {
			t.Errorf("%s: %+v, %v; want the servers asked", name, got, err)
		}
	}
	// Too large for a header: not sent.
	big := *res
	big.Request.Env = []string{"X=" + strings.Repeat("x", MaxForwardedResolution)}
	h = http.Header{}
	if SetResolution(h, req, &big); h.Get(HeaderResolution) != "" {
		t.Error("a resolution over the bound was sent")
	}
	for _, v := range []string{"not base64!", "bm90IGpzb24=", "e30="} { // not JSON; {} (no digest)
		if f := ResolutionOf(http.Header{HeaderResolution: {v}}); f != nil {
			t.Errorf("header %q decoded as %+v", v, f)
		}
	}
}
