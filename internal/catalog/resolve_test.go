package catalog

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

func digest(c byte) string {
	d := make([]byte, 64)
	for i := range d {
		d[i] = c
	}
	return "sha256:" + string(d)
}

// TestResolve: an environment's defaults and layers, a tag recorded as its version, a layer
// imported in parts, a snapshot's chain, another project's private layer and environment, the
// volumes of the project (and the node's, on one node), and the checks that need no lookup.
func TestResolve(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	a, err := st.CreateProject(ctx, "a", "test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateProject(ctx, "b", "test"); err != nil {
		t.Fatal(err)
	}
	publish := func(l model.Layer) {
		t.Helper()
		if _, _, err := st.PublishLayer(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	cfg := &model.ImageConfig{Env: []string{"A=1"}, Services: []model.Service{{Name: "web", Command: []string{"/bin/web"}}}}
	publish(model.Layer{Name: "base", Version: "1", Kind: model.KindBase, Digest: digest('1'), ImageConfig: cfg, FillRate: 7, Public: true})
	publish(model.Layer{Name: "part", Version: "1", Kind: model.KindToolkit, Digest: digest('2'), Public: true})
	publish(model.Layer{Name: "tk", Version: "2", Kind: model.KindToolkit, Digest: digest('3'), Below: []string{"part:1"}, Public: true})
	publish(model.Layer{Name: "secret", Version: "1", Kind: model.KindToolkit, Digest: digest('4'), Project: "b", Private: true})
	publish(model.Layer{Name: "snap", Version: "1", Kind: model.KindSnapshot, Digest: digest('5'), Project: "a",
		Snapshot: &model.SnapshotOf{Base: "base:1", Toolkits: []string{"tk:2"}, Sandbox: "x"}})
	if _, err := st.TagLayer(ctx, "tk", "latest", "2"); err != nil {
		t.Fatal(err)
	}
	net := &model.NetworkPolicy{Mode: model.NetworkNone}
	if _, err := st.PutEnvironment(ctx, model.Environment{Name: "env", Base: "base:1", Toolkits: []string{"tk:latest"}, Runtime: "gvisor", Network: net}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutEnvironment(ctx, model.Environment{Name: "vmenv", Base: "base:1", Tier: TierMicroVM, MicroVMTemplate: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutEnvironment(ctx, model.Environment{Name: "theirs", Base: "base:1", Project: "b"}); err != nil {
		t.Fatal(err)
	}
	vol := &store.VolumeRecord{Volume: model.Volume{Name: "data", Project: "a", SizeBytes: 1 << 20, Node: "n1", CreatedAt: time.Now().UTC()},
		ID: store.NewVolumeID(), ProjectID: a.ID, State: store.VolumeReady}
	if err := st.CreateVolume(ctx, vol); err != nil {
		t.Fatal(err)
	}
	r := &Resolver{Store: st}

	res, err := r.Resolve(ctx, model.CreateRequest{Project: "/a", Environment: "env", Volumes: []model.VolumeMount{{Name: "data", Path: "/data"}}}, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{digest('1'), digest('2'), digest('3')}
	switch {
	case !slices.Equal(res.Digests, want):
		t.Errorf("digests %v, want %v (base, the toolkit's part, the toolkit)", res.Digests, want)
	case res.Request.Base != "base:1" || !slices.Equal(res.Request.Toolkits, []string{"tk:2"}):
		t.Errorf("layers %q %q: the environment's, the tag as its version", res.Request.Base, res.Request.Toolkits)
	case res.Request.Runtime != "gvisor" || res.Request.Network == nil || res.Request.Network.Mode != model.NetworkNone || res.Tier != TierContainer:
		t.Errorf("the environment's defaults: tier %q runtime %q network %+v", res.Tier, res.Request.Runtime, res.Request.Network)
	case res.ProjectID != a.ID || res.ProjectPath != "a":
		t.Errorf("project %q %q", res.ProjectID, res.ProjectPath)
	case len(res.VolumeIDs) != 1 || res.VolumeIDs[0] != vol.ID || res.Volumes[0].Path != "/data":
		t.Errorf("volumes %+v %v", res.Volumes, res.VolumeIDs)
	case res.ImageConfig == nil || res.ImageConfig.Env[0] != "A=1" || len(res.Services) != 1 || res.Fill[digest('1')] != 7:
		t.Errorf("image config %+v, services %+v, fill %v", res.ImageConfig, res.Services, res.Fill)
	}
	// The request's own tier and runtime win over the environment's.
	if res, err := r.Resolve(ctx, model.CreateRequest{Project: "/a", Environment: "vmenv"}, false); err != nil || res.Tier != TierMicroVM || !res.Template {
		t.Errorf("a microvm environment: %+v, %v", res, err)
	}
	if res, err := r.Resolve(ctx, model.CreateRequest{Project: "/a", Environment: "vmenv", Tier: TierContainer}, false); err != nil || res.Tier != TierContainer {
		t.Errorf("a container of a microvm environment: %+v, %v", res, err)
	}
	if res, err := r.Resolve(ctx, model.CreateRequest{Project: "/a", Environment: "env", Runtime: "runc"}, false); err != nil || res.Request.Runtime != "runc" {
		t.Errorf("the request's runtime: %+v, %v", res, err)
	}
	// An fncall pool's container takes no environment defaults.
	if res, err := r.Resolve(ctx, model.CreateRequest{Project: "/a", Base: "base:1"}, true); err != nil || res.Tier != TierFncall {
		t.Errorf("an fncall container: %+v, %v", res, err)
	}
	// A snapshot brings its chain.
	res, err = r.Resolve(ctx, model.CreateRequest{Project: "/a", FromSnapshot: "snap:1"}, false)
	if err != nil || !slices.Equal(res.Digests, []string{digest('1'), digest('2'), digest('3'), digest('5')}) || res.Request.Base != "base:1" {
		t.Errorf("from a snapshot: %+v, %v", res, err)
	}

	for _, tc := range []struct {
		req   model.CreateRequest
		field string
	}{
		{model.CreateRequest{Project: "/a"}, "base"},
		{model.CreateRequest{Project: "/nope", Base: "base:1"}, "project"},
		{model.CreateRequest{Project: "/a", Base: "base:2"}, "base"},
		{model.CreateRequest{Project: "/a", Base: "tk:2"}, "base"},                                          // a toolkit as a base
		{model.CreateRequest{Project: "/a", Base: "base:1", Toolkits: []string{"secret:1"}}, "toolkits[0]"}, // another project's private layer
		{model.CreateRequest{Project: "/a", Environment: "theirs"}, "environment"},
		{model.CreateRequest{Project: "/a", Environment: "none"}, "environment"},
		{model.CreateRequest{Project: "/a", Environment: "env", Base: "base:1"}, "environment"},
		{model.CreateRequest{Project: "/a", FromSnapshot: "snap:1", Base: "base:1"}, "from_snapshot"},
		{model.CreateRequest{Project: "/a", FromSnapshot: "base:1"}, "from_snapshot"},
		{model.CreateRequest{Project: "/a", Base: "base:1", Tier: "fncall"}, "tier"},
		{model.CreateRequest{Project: "/a", Base: "base:1", Tier: "bare"}, "tier"},
		{model.CreateRequest{Project: "/a", Base: "base:1", Tier: TierVM}, "image"},
		{model.CreateRequest{Project: "/a", Base: "base:1", Image: "disk:1"}, "image"},
		{model.CreateRequest{Project: "/a", Base: "base:1", Hostname: "-x"}, "hostname"},
		{model.CreateRequest{Project: "/a", Base: "base:1", Env: []string{"NOEQUALS"}}, "env[0]"},
		{model.CreateRequest{Project: "/a", Base: "base:1", Volumes: []model.VolumeMount{{Name: "nope", Path: "/d"}}}, "volumes[0].name"},
		{model.CreateRequest{Project: "/b", Base: "base:1", Volumes: []model.VolumeMount{{Name: "data", Path: "/d"}}}, "volumes[0].name"},
		{model.CreateRequest{Project: "/a", Base: "base:1", Volumes: []model.VolumeMount{{Name: "data", Path: "relative"}}}, "volumes[0].path"},
		{model.CreateRequest{Project: "/a", Base: "base:1", Tier: TierVM, Image: "x:1", Volumes: []model.VolumeMount{{Name: "data", Path: "/d"}}}, "volumes"},
	} {
		_, err := r.Resolve(ctx, tc.req, false)
		if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Field(err) != tc.field {
			t.Errorf("%+v: %v, want invalid %s", tc.req, err, tc.field)
		}
	}
	// On one node, a volume attaches only where it lives.
	onNode := &Resolver{Store: st, Node: "n2"}
	if _, err := onNode.Resolve(ctx, model.CreateRequest{Project: "/a", Base: "base:1", Volumes: []model.VolumeMount{{Name: "data", Path: "/d"}}}, false); errdefs.Field(err) != "volumes[0].name" {
		t.Errorf("another node's volume: %v", err)
	}
}
