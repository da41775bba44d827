package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
)

// TestNodeCatalogRead: an edge reads the catalogue for its builds and snapshots through the
// servers, only for a caller sealed for its node who may read layers in the project asked
// about, and only what that project sees: another project's private layer or environment is
// answered as one that does not exist.
func TestNodeCatalogRead(t *testing.T) {
	ctx := context.Background()
	st, srv, edge1 := registeredEdge(t, ctx)
	for _, p := range []string{"a", "a/sub", "b"} {
		if _, err := st.CreateProject(ctx, p, "root"); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []model.Layer{
		{Name: "abase", Version: "1", Kind: model.KindBase, Digest: "sha256:" + strings.Repeat("a", 64), Project: "/a"},
		{Name: "bbase", Version: "1", Kind: model.KindBase, Digest: "sha256:" + strings.Repeat("b", 64), Project: "/b"},
	} {
		if _, _, err := st.PublishLayer(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.TagLayer(ctx, "abase", "latest", "1"); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	for _, env := range []model.Environment{{Name: "aenv", Base: "abase:1", Project: "/a", CreatedAt: now}, {Name: "benv", Base: "bbase:1", Project: "/b", CreatedAt: now}} {
		if _, err := st.PutEnvironment(ctx, env); err != nil {
			t.Fatal(err)
		}
	}
	rd := edge1.CatalogReader()
	inSub := sealedFor(t, ctx, "edge1", map[string]iam.Perm{"a/sub": iam.LayerRead | iam.LayerPublish | iam.SandboxAdmin}, srv.sealer)

	// A project sees its ancestors' layers and environments (tags resolved), not a sibling's.
	if l, err := rd.VisibleLayer(inSub, "a/sub", "abase", "latest"); err != nil || l.Version != "1" {
		t.Errorf("an ancestor's layer by its tag: %+v, %v", l, err)
	}
	if env, err := rd.VisibleEnvironment(inSub, "a/sub", "aenv"); err != nil || env.Base != "abase:1" {
		t.Errorf("an ancestor's environment: %+v, %v", env, err)
	}
	if _, err := rd.VisibleLayer(inSub, "a/sub", "bbase", "1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another project's layer: %v, want not found", err)
	}
	if _, err := rd.VisibleEnvironment(inSub, "a/sub", "benv"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another project's environment: %v, want not found", err)
	}
	if _, err := rd.VisibleLayer(inSub, "a/sub", "nothing", "1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a layer nobody published: %v, want not found", err)
	}
	// Environment names are one namespace: whose a name is, is answered (a build may not take it).
	if owner, exists, err := rd.EnvironmentOwner(inSub, "a/sub", "benv"); err != nil || !exists || owner != "b" {
		t.Errorf("benv's owner: %q, %v, %v; want b", owner, exists, err)
	}
	if _, exists, err := rd.EnvironmentOwner(inSub, "a/sub", "free"); err != nil || exists {
		t.Errorf("a free name: exists %v, %v", exists, err)
	}

	// A name's versions, for the API's guards: those the caller can read, whichever project.
	readerOfA := sealedFor(t, ctx, "edge1", map[string]iam.Perm{"a": iam.LayerRead}, srv.sealer)
	if ls, err := rd.LayerVersions(readerOfA, "abase"); err != nil || len(ls) != 1 || ls[0].Project != "a" {
		t.Errorf("abase's versions for a reader of a: %+v, %v", ls, err)
	}
	if ls, err := rd.LayerVersions(readerOfA, "bbase"); err != nil || len(ls) != 0 {
		t.Errorf("another project's versions: %+v, %v; want none", ls, err)
	}
	if l, err := rd.ReadableLayer(readerOfA, "abase", "latest"); err != nil || l.Version != "1" {
		t.Errorf("abase by its tag for a reader of a: %+v, %v", l, err)
	}
	if _, err := rd.ReadableLayer(readerOfA, "bbase", "1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another project's layer for a reader of a: %v, want not found", err)
	}
	if _, err := rd.LayerVersions(ctx, "abase"); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("a name's versions without a caller: %v, want ErrDenied", err)
	}

	// Only for a sealed caller of this node who may read layers in the project asked about.
	for name, vctx := range map[string]context.Context{
		"no caller":                        ctx,
		"a caller sealed for another node": sealedFor(t, ctx, "edge2", map[string]iam.Perm{"a/sub": iam.LayerRead}, srv.sealer),
		"a reader of another project":      sealedFor(t, ctx, "edge1", map[string]iam.Perm{"b": iam.LayerRead}, srv.sealer),
	} {
		if _, err := rd.VisibleLayer(vctx, "a/sub", "abase", "1"); !errors.Is(err, errdefs.ErrDenied) {
			t.Errorf("read a layer for %s: %v, want ErrDenied", name, err)
		}
		if _, _, err := rd.EnvironmentOwner(vctx, "a/sub", "aenv"); !errors.Is(err, errdefs.ErrDenied) {
			t.Errorf("read an environment's owner for %s: %v, want ErrDenied", name, err)
		}
	}
	// A read for a project the caller holds nothing in, even one that would see more.
	if _, err := rd.VisibleLayer(inSub, "b", "bbase", "1"); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("read as project b for a caller of a/sub: %v, want ErrDenied", err)
	}
	if _, err := rd.VisibleLayer(inSub, "a/sub", "Bad Name", "1"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a malformed name: %v, want invalid", err)
	}
}
