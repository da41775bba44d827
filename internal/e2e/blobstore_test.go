package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/blobstore"
	"github.com/corral-dev/corral/internal/blobstore/s3test"
	corral "github.com/corral-dev/corral/sdk/go"
)

// TestSharedBlobStore: two Corrals configured with one S3 blob store (a real versitygw) share
// layers. A version published on one is listed and usable on the other, whose first sandbox
// fetches the image into its own cache; the other's garbage collector keeps content that a
// shared version names; once no Corral publishes it, the content leaves the bucket. Only public
// versions are adopted: one kept to its project stays on its Corral (its content kept from the
// other's collector all the same) until it is published.
func TestSharedBlobStore(t *testing.T) {
	needRoot(t)
	srv := s3test.Start(t)
	spec := srv.Spec(s3test.Bucket, "shared", "&access_key_file="+srv.KeyFile)
	a := startCorral(t, "--blob-store", spec)
	b := startCorral(t, "--blob-store", spec)
	ctx := context.Background()
	bs, err := blobstore.Open(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	public := corral.ImportOptions{Public: true}
	a.importDirWith(a.Client, "base", "shared", corral.KindBase, busyboxRootfs(t), public)
	tk := t.TempDir()
	os.MkdirAll(filepath.Join(tk, "opt/tk"), 0o755)
	os.WriteFile(filepath.Join(tk, "opt/tk/hello"), []byte("from a\n"), 0o644)
	a.importDirWith(a.Client, "tk", "1", corral.KindToolkit, tk, public)

	ls, err := b.Client.Layers(ctx, "")
	if err != nil || len(ls) != 2 {
		t.Fatalf("layers on the second Corral = %+v, %v; want the 2 published on the first", ls, err)
	}
	sb := b.create(corral.CreateRequest{Base: "base:shared", Toolkits: []string{"tk:1"}})
	if out := strings.TrimSpace(b.sh(sb.ID, "cat /opt/tk/hello")); out != "from a" {
		t.Errorf("toolkit file in the second Corral's sandbox = %q", out)
	}
	if !strings.Contains(b.Logs(), "layer image fetched") {
		t.Error("the second Corral did not fetch the images into its cache")
	}
	b.Client.DeleteSandbox(ctx, sb.ID)

	// The second Corral deleting its copy of the version, and collecting, must not take the
	// content that the first still has.
	if _, err := b.Client.DeleteLayer(ctx, "tk", "1"); err != nil {
		t.Fatal(err)
	}
	if res, err := b.Client.GCLayers(ctx); err != nil || res.Removed != 0 {
		t.Fatalf("GC on the second Corral = %+v, %v; want nothing removed", res, err)
	}
	sb = a.create(corral.CreateRequest{Base: "base:shared", Toolkits: []string{"tk:1"}})
	if out := strings.TrimSpace(a.sh(sb.ID, "cat /opt/tk/hello")); out != "from a" {
		t.Errorf("after the second Corral deleted tk:1, the first's sandbox reads %q", out)
	}
	a.Client.DeleteSandbox(ctx, sb.ID)
	// Both deleted it: its content goes with the next collection.
	if _, err := a.Client.DeleteLayer(ctx, "tk", "1"); err != nil {
		t.Fatal(err)
	}
	if ls, _ := a.Client.Layers(ctx, ""); len(ls) != 1 {
		t.Errorf("after deleting tk:1 on both, the first Corral lists %d layers; want 1", len(ls))
	}
	// The last delete removed the toolkit's record and image from the bucket; the base stays.
	for _, prefix := range []string{"layers/sha256/", "images/sha256/"} {
		if objs, err := bs.List(ctx, prefix); err != nil || len(objs) != 1 {
			t.Errorf("%s in the bucket: %+v, %v; want only the base's", prefix, objs, err)
		}
	}
	// A blob whose ref is not written yet (an import of the first Corral between its record and
	// its publish, made here by removing the ref): the second Corral's collector leaves it, the
	// first's own collector may take it.
	tk2 := t.TempDir()
	os.WriteFile(filepath.Join(tk2, "two"), []byte("2"), 0o644)
	a.importDir("tk", "2", corral.KindToolkit, tk2)
	refs, err := bs.List(ctx, "refs/tk/2/")
	if err != nil || len(refs) != 1 {
		t.Fatalf("refs of tk:2: %+v, %v", refs, err)
	}
	if err := bs.Delete(ctx, refs[0].Key); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Client.GCLayers(ctx); err != nil {
		t.Fatal(err)
	}
	if objs, _ := bs.List(ctx, "layers/sha256/"); len(objs) != 2 {
		t.Errorf("GC on the second Corral took the first's fresh import: %d records left, want 2", len(objs))
	}
	if _, err := a.Client.DeleteLayer(ctx, "tk", "2"); err != nil {
		t.Fatal(err)
	}
	if objs, _ := bs.List(ctx, "layers/sha256/"); len(objs) != 1 {
		t.Errorf("after the first Corral deleted tk:2, %d records remain; want the base's only", len(objs))
	}
	// One ref of base:shared per Corral that has it (the second adopted it); none of tk:1.
	if objs, err := bs.List(ctx, "refs/"); err != nil || len(objs) != 2 ||
		!strings.HasPrefix(objs[0].Key, "refs/base/shared/") || !strings.HasPrefix(objs[1].Key, "refs/base/shared/") {
		t.Errorf("refs in the bucket: %+v, %v; want base:shared's of each Corral", objs, err)
	}

	// A version that is not public (the root's: the first Corral's root project alone).
	sec := t.TempDir()
	os.WriteFile(filepath.Join(sec, "answer"), []byte("42\n"), 0o644)
	a.importDir("secret", "1", corral.KindToolkit, sec)
	if ls, err := b.Client.Layers(ctx, "secret"); err != nil || len(ls) != 0 {
		t.Fatalf("the second Corral lists the first's private version: %+v, %v", ls, err)
	}
	if _, err := b.Client.CreateSandbox(ctx, corral.CreateRequest{Base: "base:shared", Toolkits: []string{"secret:1"}}); !corral.IsInvalid(err) || !strings.Contains(err.Error(), "not published") {
		t.Fatalf("a sandbox of the second Corral on the first's private version: %v", err)
	}
	if _, err := b.Client.GCLayers(ctx); err != nil {
		t.Fatal(err)
	}
	sb = a.create(corral.CreateRequest{Base: "base:shared", Toolkits: []string{"secret:1"}})
	if out := strings.TrimSpace(a.sh(sb.ID, "cat /answer")); out != "42" {
		t.Errorf("after the second Corral's collection the private version reads %q", out)
	}
	a.Client.DeleteSandbox(ctx, sb.ID)
	if _, err := a.Client.SetLayerPublic(ctx, "secret", "1", true); err != nil {
		t.Fatal(err)
	}
	if ls, err := b.Client.Layers(ctx, "secret"); err != nil || len(ls) != 1 || !ls[0].Public || ls[0].Project != corral.RootProject {
		t.Fatalf("the published version on the second Corral: %+v, %v; want it adopted, public, in the root", ls, err)
	}
}
