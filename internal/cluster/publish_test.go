package cluster

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/nodeproto"
	"github.com/corral-dev/corral/internal/store"
)

// sealedFor returns ctx carrying a caller who holds held in each project (canonical path),
// sealed for node by sealer, as a replica forwards it to that node's edge.
func sealedFor(t *testing.T, ctx context.Context, node string, held map[string]iam.Perm, sealer *nodeproto.Sealer) context.Context {
	t.Helper()
	var all iam.Perm
	for _, p := range held {
		all |= p
	}
	h := http.Header{}
	c := &nodeproto.Caller{TokenID: "t1", Principal: "root", Perms: all, Held: held, CreatedAt: time.Now()}
	if err := nodeproto.SetSealedCaller(h, c, node, sealer, nodeproto.VoucherTTL); err != nil {
		t.Fatal(err)
	}
	return nodeproto.WithVoucher(ctx, nodeproto.VoucherOf(h))
}

// registeredEdge joins edge1 to a replica of a fresh cluster and registers it (at an address
// nothing answers), and returns the store, the replica and edge1's node channel.
func registeredEdge(t *testing.T, ctx context.Context) (*store.Store, *Server, *nodeproto.Servers) {
	t.Helper()
	st, srv, hs, dir := nodeChannelReplica(t)
	j, err := Join(ctx, hs.URL, filepath.Join(dir, "join.token"), "edge1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Servers.Register(ctx, nodeproto.RegisterRequest{URL: "https://127.0.0.1:1", Protocol: nodeproto.Version, LeaseTTLMillis: 15000}); err != nil {
		t.Fatal(err)
	}
	return st, srv, j.Servers
}

// TestNodePublish: an edge publishes, changes and deletes layer versions and saves a build's
// environment through the servers, only for a caller sealed for its node who may publish in the
// layer's project; each record is checked as the catalogue keeps it, no version is rewritten,
// and the store's refusals come back as `corral up` gives them.
func TestNodePublish(t *testing.T) {
	ctx := context.Background()
	st, srv, edge1 := registeredEdge(t, ctx)
	for _, p := range []string{"a", "b"} {
		if _, err := st.CreateProject(ctx, p, "root"); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := st.PublishLayer(ctx, model.Layer{Name: "bpart", Version: "1", Kind: model.KindBase, Digest: "sha256:" + strings.Repeat("b", 64), Project: "/b"}); err != nil {
		t.Fatal(err)
	}
	pub := edge1.Publisher()
	foreign, err := nodeproto.NewSealer([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	publisher := sealedFor(t, ctx, "edge1", map[string]iam.Perm{"a": iam.LayerPublish | iam.SandboxAdmin}, srv.sealer)
	digest := "sha256:" + strings.Repeat("a", 64)
	layer := model.Layer{Name: "apart", Version: "1", Kind: model.KindBase, Digest: digest, Size: 10, Files: 1, Project: "/a", CreatedAt: time.Now().UTC()}

	for name, vctx := range map[string]context.Context{
		"no caller":                        ctx,
		"a caller sealed for another node": sealedFor(t, ctx, "edge2", map[string]iam.Perm{"a": iam.LayerPublish}, srv.sealer),
		"a caller sealed with another key": sealedFor(t, ctx, "edge1", map[string]iam.Perm{"a": iam.LayerPublish}, foreign),
		"a caller who may only create":     sealedFor(t, ctx, "edge1", map[string]iam.Perm{"a": iam.SandboxCreate | iam.LayerRead}, srv.sealer),
		"a publisher of another project":   sealedFor(t, ctx, "edge1", map[string]iam.Perm{"b": iam.LayerPublish}, srv.sealer),
	} {
		if _, _, err := pub.PublishLayer(vctx, layer); !errors.Is(err, errdefs.ErrDenied) {
			t.Errorf("publish for %s: %v, want ErrDenied", name, err)
		}
	}
	if _, err := st.GetLayer(ctx, "apart", "1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a refused publish left a version: %v", err)
	}

	// Records the catalogue must not keep, each refused with its field.
	for _, c := range []struct {
		field string
		edit  func(l *model.Layer)
	}{
		{"layer.name", func(l *model.Layer) { l.Name = "Bad Name" }},
		{"layer.kind", func(l *model.Layer) { l.Kind = "rootkit" }},
		{"layer.digest", func(l *model.Layer) { l.Digest = "sha256:short" }},
		{"layer.public", func(l *model.Layer) { l.Private, l.Public = true, true }},
		{"layer.snapshot", func(l *model.Layer) { l.Snapshot = &model.SnapshotOf{Base: "bpart:1"} }},
		{"layer.snapshot", func(l *model.Layer) { l.Kind = model.KindSnapshot }},
		{"layer.tags", func(l *model.Layer) { l.Tags = []string{"latest"} }},
		{"layer.fill_rate", func(l *model.Layer) { l.FillRate = -2 }},
		{"image_config.working_dir", func(l *model.Layer) { l.ImageConfig = &model.ImageConfig{WorkingDir: "relative"} }},
		{"layer.below[0]", func(l *model.Layer) { l.Below = []string{"bpart:1"} }}, // /b's, not usable in /a
		{"layer.below[0]", func(l *model.Layer) { l.Below = []string{"nothing:1"} }},
		{"layer.below", func(l *model.Layer) { l.Kind, l.Below = model.KindVMImage, []string{"x:1"} }},
	} {
		l := layer
		c.edit(&l)
		_, _, err := pub.PublishLayer(publisher, l)
		if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Field(err) != c.field {
			t.Errorf("publish %+v: %v (field %q), want invalid %s", l, err, errdefs.Field(err), c.field)
		}
	}

	got, created, err := pub.PublishLayer(publisher, layer)
	if err != nil || !created || got.Project != "a" || got.Digest != digest {
		t.Fatalf("publish for /a's publisher: %+v, %v, %v", got, created, err)
	}
	if _, created, err := pub.PublishLayer(publisher, layer); err != nil || created {
		t.Errorf("the same version again (an answer that broke off): created %v, %v", created, err)
	}
	other := layer
	other.Digest = "sha256:" + strings.Repeat("c", 64)
	if _, _, err := pub.PublishLayer(publisher, other); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("the version with other content: %v, want a conflict (versions are immutable)", err)
	}
	stacked := model.Layer{Name: "astack", Version: "1", Kind: model.KindBase, Digest: "sha256:" + strings.Repeat("d", 64), Project: "/a", Below: []string{"apart:1"}}
	if _, _, err := pub.PublishLayer(publisher, stacked); err != nil {
		t.Errorf("a version stacked on a part of its project: %v", err)
	}
	stacked.Version, stacked.Public = "2", true
	if _, _, err := pub.PublishLayer(publisher, stacked); !errors.Is(err, errdefs.ErrInvalid) || errdefs.Field(err) != "layer.below[0]" {
		t.Errorf("a public version on a part that is not: %v", err)
	}

	// Settings and deletes: for a publisher of the version's project only; tags are no versions.
	readerOfA := sealedFor(t, ctx, "edge1", map[string]iam.Perm{"a": iam.LayerRead | iam.SandboxCreate}, srv.sealer)
	if _, err := pub.SetLayerFillRate(readerOfA, "apart", "1", 1<<20); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("set the fill rate for a reader: %v, want ErrDenied", err)
	}
	if _, err := pub.DeleteLayer(ctx, "apart", "1"); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("delete without a caller: %v, want ErrDenied", err)
	}
	if l, err := pub.SetLayerFillRate(publisher, "apart", "1", 1<<20); err != nil || l.FillRate != 1<<20 {
		t.Errorf("set the fill rate: %+v, %v", l, err)
	}
	if _, err := pub.SetLayerFillRate(publisher, "apart", "1", -2); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a fill rate below -1: %v", err)
	}
	if l, err := pub.SetLayerPublic(publisher, "apart", "1", true); err != nil || !l.Public {
		t.Errorf("make it public: %+v, %v", l, err)
	}
	if _, err := pub.SetLayerPublic(publisher, "astack", "1", true); err != nil {
		t.Errorf("make astack public, its part public now: %v", err)
	}
	if _, err := st.TagLayer(ctx, "apart", "latest", "1"); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.SetLayerPublic(publisher, "apart", "latest", false); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("set a tag's visibility: %v, want invalid", err)
	}
	if _, err := pub.DeleteLayer(publisher, "apart", "1"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("delete a tagged version: %v, want a conflict", err)
	}
	if _, err := pub.DeleteLayer(publisher, "bpart", "1"); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("delete another project's version: %v, want ErrDenied", err)
	}
	if _, err := pub.DeleteLayer(publisher, "nothing", "1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("delete a version nobody published: %v, want not found", err)
	}
	if l, err := pub.DeleteLayer(publisher, "astack", "1"); err != nil || l.Digest != stacked.Digest {
		t.Errorf("delete astack:1: %+v, %v", l, err)
	}
	if _, err := st.GetLayer(ctx, "astack", "1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("after the delete: %v", err)
	}

	// A build's environment: saved for a publisher of its project, checked, replacing an
	// earlier build's.
	env := model.Environment{Name: "built", Base: "apart:1", Project: "/a"}
	if _, err := pub.ReplaceEnvironment(readerOfA, env); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("save a build's environment for a reader: %v, want ErrDenied", err)
	}
	if _, err := pub.ReplaceEnvironment(publisher, model.Environment{Name: "built", Base: "bpart:1", Project: "/a"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("an environment on another project's layer: %v, want invalid", err)
	}
	if saved, err := pub.ReplaceEnvironment(publisher, env); err != nil || saved.Project != "a" {
		t.Errorf("save the build's environment: %+v, %v", saved, err)
	}
	if _, err := pub.ReplaceEnvironment(sealedFor(t, ctx, "edge1", map[string]iam.Perm{"b": iam.LayerPublish}, srv.sealer),
		model.Environment{Name: "built", Base: "bpart:1", Project: "/b"}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("another project's build of the same name: %v, want a conflict", err)
	}
}
