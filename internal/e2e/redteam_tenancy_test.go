package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// Red-team cases of issue 22 items 3 and 5: one tenant reaching another's fncall artifacts, or
// another project's (and the operator's root project's) snapshots and layers. Both are decided
// in the API and the edge before any runtime is asked, so most cases run on runc (snapshots are
// taken of runc sandboxes, and fncall pools are runc containers); using and being refused a
// layer is checked on runc, gVisor and microvm.

// tenancy is a Corral with the projects a, a/sub and b, and an admin client scoped to each.
type tenancy struct {
	p            *corralProc
	a, sub, b    *corral.Client
	aID, bID     string
	tokA, tokSub string
}

func newTenancy(t *testing.T) *tenancy {
	t.Helper()
	return newTenancyWith(t)
}

// newTenancyWith is newTenancy on a corral started with extra arguments.
func newTenancyWith(t *testing.T, extra ...string) *tenancy {
	t.Helper()
	p := withBase(t, extra...)
	ctx := t.Context()
	x := &tenancy{p: p}
	ids := map[string]string{}
	for _, path := range []string{"a", "a/sub", "b"} {
		pr, err := p.Client.CreateProject(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		ids[path] = pr.ID
	}
	x.aID, x.bID = ids["a"], ids["b"]
	client := func(project string) (*corral.Client, string) {
		tok, err := p.Client.CreateToken(ctx, corral.TokenRequest{Project: project, Role: corral.RoleAdmin, Kind: corral.KindService, Name: "admin-" + strings.ReplaceAll(project, "/", "-")})
		if err != nil {
			t.Fatal(err)
		}
		return corral.New(p.URL, tok.Token), tok.Token
	}
	x.a, x.tokA = client("a")
	x.sub, x.tokSub = client("a/sub")
	x.b, _ = client("b")
	return x
}

// sameRefusal fails unless err and want are the same API answer (status, code, field and
// message, once each names its own reference), so a refusal tells nothing a reference to
// something that never existed would not.
func sameRefusal(t *testing.T, what string, err error, ref string, want error, wantRef string) {
	t.Helper()
	var got, exp *corral.APIError
	if !errors.As(err, &got) || !errors.As(want, &exp) {
		t.Fatalf("%s: %v and %v, want API errors", what, err, want)
	}
	if got.Status != exp.Status || got.Code != exp.Code || got.Field != exp.Field ||
		strings.ReplaceAll(got.Message, ref, "REF") != strings.ReplaceAll(exp.Message, wantRef, "REF") {
		t.Errorf("%s: answered %d %s %q %q; something that does not exist: %d %s %q %q", what,
			got.Status, got.Code, got.Field, got.Message, exp.Status, exp.Code, exp.Field, exp.Message)
	}
}

func TestRedTeamTenancyLayers(t *testing.T) {
	needRoot(t)
	x := newTenancy(t)
	p, ctx := x.p, t.Context()
	tool := t.TempDir()
	if err := os.WriteFile(filepath.Join(tool, "answer"), []byte("42\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The operator's snapshot of a sandbox holding an answer key, in the root project.
	root := p.create(corral.CreateRequest{Base: "base:test"})
	p.sh(root.ID, "echo 42 > /answer-key")
	if _, err := p.Client.Snapshot(ctx, root.ID, corral.SnapshotRequest{Name: "key", Version: "1"}); err != nil {
		t.Fatal(err)
	}
	p.importDir("root-tool", "1", corral.KindToolkit, tool)
	// Project a's own layer and snapshot.
	p.importDirWith(x.a, "tool-a", "1", corral.KindToolkit, tool, corral.ImportOptions{})
	sa, err := x.a.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Project: "a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Client.DeleteSandbox(context.Background(), sa.ID) })
	if _, err := x.a.Snapshot(ctx, sa.ID, corral.SnapshotRequest{Name: "snap-a", Version: "1"}); err != nil {
		t.Fatal(err)
	}

	// What B gets for something that never existed, to compare with.
	_, never := x.b.Layer(ctx, "nothing", "1")
	_, neverCreate := x.b.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Toolkits: []string{"nothing:1"}})
	_, neverSnap := x.b.CreateSandbox(ctx, corral.CreateRequest{FromSnapshot: "nothing:1"})
	_, neverEnv := x.b.SaveEnvironment(ctx, corral.Environment{Name: "env-b", Base: "base:test", Toolkits: []string{"nothing:1"}})
	_, neverSet := x.b.SetLayerPublic(ctx, "nothing", "1", false)
	if !corral.IsNotFound(never) || !corral.IsInvalid(neverCreate) || !corral.IsNotFound(neverSet) {
		t.Fatalf("references to nothing: %v, %v, %v", never, neverCreate, neverSet)
	}

	// B, and the tenant projects a and a/sub for the root's layers, see nothing.
	hidden := []struct {
		c          *corral.Client
		who, layer string
	}{{x.b, "b", "tool-a:1"}, {x.b, "b", "snap-a:1"}, {x.b, "b", "key:1"}, {x.b, "b", "root-tool:1"},
		{x.a, "a", "key:1"}, {x.sub, "a/sub", "key:1"}, {x.a, "a", "root-tool:1"}}
	for _, h := range hidden {
		name, version, _ := strings.Cut(h.layer, ":")
		_, err := h.c.Layer(ctx, name, version)
		sameRefusal(t, h.who+" gets "+h.layer, err, name, never, "nothing")
		if ls, err := h.c.Layers(ctx, ""); err != nil {
			t.Fatal(err)
		} else {
			for _, l := range ls {
				if l.Name == name {
					t.Errorf("%s lists %s:%s", h.who, l.Name, l.Version)
				}
			}
		}
		_, err = h.c.SetLayerPublic(ctx, name, version, true)
		sameRefusal(t, h.who+" publishes "+h.layer, err, name, neverSet, "nothing")
		if strings.HasPrefix(name, "snap") || name == "key" {
			_, err = h.c.CreateSandbox(ctx, corral.CreateRequest{FromSnapshot: h.layer})
			sameRefusal(t, h.who+" creates from "+h.layer, err, h.layer, neverSnap, "nothing:1")
		} else {
			_, err = h.c.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Toolkits: []string{h.layer}})
			sameRefusal(t, h.who+" creates on "+h.layer, err, h.layer, neverCreate, "nothing:1")
			_, err = h.c.SaveEnvironment(ctx, corral.Environment{Name: "env-x", Base: "base:test", Toolkits: []string{h.layer}})
			sameRefusal(t, h.who+" saves an environment on "+h.layer, err, h.layer, neverEnv, "nothing:1")
			_, err = h.c.CreateFncallEnv(ctx, corral.FncallEnv{Name: "fx", Base: "base:test", Toolkits: []string{h.layer}, PoolMin: 1})
			if !corral.IsInvalid(err) || !strings.Contains(err.Error(), "is not published") {
				t.Errorf("%s makes an fncall environment on %s: %v", h.who, h.layer, err)
			}
		}
	}
	// The layer's kind is not told either: a hidden snapshot named as a toolkit reads the same.
	_, err = x.b.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Toolkits: []string{"snap-a:1"}})
	sameRefusal(t, "b names snap-a:1 as a toolkit", err, "snap-a:1", neverCreate, "nothing:1")

	// a/sub, in a's subtree, uses a's layer and snapshot; a and the root their own.
	for _, req := range []corral.CreateRequest{{Base: "base:test", Toolkits: []string{"tool-a:1"}}, {FromSnapshot: "snap-a:1"}} {
		sb, err := x.sub.CreateSandbox(ctx, req)
		if err != nil {
			t.Fatalf("a/sub uses a's layers (%+v): %v", req, err)
		}
		p.Client.DeleteSandbox(ctx, sb.ID)
	}
	// The same on every tier: admission decides before a runtime is asked.
	forRuntimes(t, func(t *testing.T, rt string) {
		on := func(r corral.CreateRequest) corral.CreateRequest {
			if rt == "microvm" {
				r.Tier = "microvm"
			} else {
				r.Runtime = rt
			}
			return r
		}
		_, never := x.b.CreateSandbox(ctx, on(corral.CreateRequest{Base: "base:test", Toolkits: []string{"nothing:1"}}))
		_, err := x.b.CreateSandbox(ctx, on(corral.CreateRequest{Base: "base:test", Toolkits: []string{"tool-a:1"}}))
		sameRefusal(t, "b creates on tool-a:1", err, "tool-a:1", never, "nothing:1")
		sb, err := x.sub.CreateSandbox(ctx, on(corral.CreateRequest{Base: "base:test", Toolkits: []string{"tool-a:1"}}))
		if err != nil {
			t.Fatalf("a/sub on a's layer: %v", err)
		}
		defer p.Client.DeleteSandbox(context.Background(), sb.ID)
		if out, _, exit, err := x.sub.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"cat", "/answer"}}); err != nil || exit.Code != 0 || string(out) != "42\n" {
			t.Errorf("a/sub's sandbox on tool-a:1: %q %+v %v", out, exit, err)
		}
	})
	kr := p.create(corral.CreateRequest{FromSnapshot: "key:1"})
	if out := p.sh(kr.ID, "cat /answer-key"); strings.TrimSpace(out) != "42" {
		t.Errorf("the root's own snapshot: %q", out)
	}
	// The operator's token acting in a tenant project is held to the tenant's view too.
	if _, err := p.Client.CreateSandbox(ctx, corral.CreateRequest{FromSnapshot: "key:1", Project: "b"}); !corral.IsInvalid(err) {
		t.Errorf("a sandbox of b from the root's private snapshot: %v", err)
	}

	// Published, B sees and uses them; taken back, it does not any more.
	if l, err := x.a.SetLayerPublic(ctx, "tool-a", "1", true); err != nil || !l.Public {
		t.Fatalf("publish tool-a:1: %+v, %v", l, err)
	}
	if _, err := x.b.Layer(ctx, "tool-a", "1"); err != nil {
		t.Errorf("b gets public tool-a:1: %v", err)
	}
	sb, err := x.b.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Toolkits: []string{"tool-a:1"}})
	if err != nil {
		t.Fatalf("b uses public tool-a:1: %v", err)
	}
	if out, _, exit, err := x.b.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"cat", "/answer"}}); err != nil || exit.Code != 0 || string(out) != "42\n" {
		t.Errorf("b's sandbox on tool-a:1: %q %+v %v", out, exit, err)
	}
	p.Client.DeleteSandbox(ctx, sb.ID)
	// Seeing a layer is not owning it: b may not take it back.
	if _, err := x.b.SetLayerPublic(ctx, "tool-a", "1", false); !corral.IsDenied(err) {
		t.Errorf("b unpublishes a's layer: %v, want denied", err)
	}
	if _, err := x.a.SetLayerPublic(ctx, "tool-a", "1", false); err != nil {
		t.Fatal(err)
	}
	_, err = x.b.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Toolkits: []string{"tool-a:1"}})
	sameRefusal(t, "b uses tool-a:1 taken back", err, "tool-a:1", neverCreate, "nothing:1")

	// A snapshot published --public from the start (the CLI), usable from b.
	if _, stderr, code := p.cliAs(x.tokA, "", "", "snapshot", sa.ID, "--name", "snap-a:pub", "--public"); code != 0 {
		t.Fatalf("corral snapshot --public: %s", stderr)
	}
	sb, err = x.b.CreateSandbox(ctx, corral.CreateRequest{FromSnapshot: "snap-a:pub"})
	if err != nil {
		t.Fatalf("b from a's public snapshot: %v", err)
	}
	p.Client.DeleteSandbox(ctx, sb.ID)
	// The root's snapshot, published by the operator, reaches the tenants.
	if _, stderr, code := p.cli("", "layer", "publish", "key:1"); code != 0 {
		t.Fatalf("corral layer publish: %s", stderr)
	}
	sb, err = x.b.CreateSandbox(ctx, corral.CreateRequest{FromSnapshot: "key:1"})
	if err != nil {
		t.Fatalf("b from the root's published snapshot: %v", err)
	}
	p.Client.DeleteSandbox(ctx, sb.ID)

	// Bad input changes nothing.
	if _, stderr, code := p.cli("", "layer", "import", "both:1", "--kind", "toolkit", "--dir", tool, "--private", "--public"); code == 0 {
		t.Error("import --private --public was accepted")
	} else if _, err := p.Client.Layer(ctx, "both", "1"); !corral.IsNotFound(err) {
		t.Errorf("a refused import left %v: %s", err, stderr)
	}
}

func TestRedTeamTenancyArtifacts(t *testing.T) {
	needRoot(t)
	x := newTenancy(t)
	p, ctx := x.p, t.Context()
	for _, e := range []struct {
		c       *corral.Client
		name, p string
	}{{x.a, "fa", "a"}, {x.b, "fb", "b"}} {
		if _, err := e.c.CreateFncallEnv(ctx, corral.FncallEnv{Name: e.name, Project: e.p, Base: "base:test", PoolMin: 1, PoolMax: 1}); err != nil {
			t.Fatal(err)
		}
	}
	kept, err := x.a.Call(ctx, "fa", corral.CallRequest{Script: "printf secret-A > out", Keep: []string{"out"}})
	if err != nil || kept.Artifacts["out"] == "" {
		t.Fatalf("a keeps a file: %+v, %v", kept, err)
	}
	ref := kept.Artifacts["out"]
	if got, err := x.a.Call(ctx, "fa", corral.CallRequest{Argv: []string{"cat", "in"}, FileRefs: map[string]string{"in": ref}}); err != nil || string(got.Stdout) != "secret-A" {
		t.Fatalf("a reads its own artifact: %+v, %v", got, err)
	}

	// B, by reference: the answer for a reference never kept, word for word.
	random := "sha256:" + strings.Repeat("7", 64)
	_, never := x.b.Call(ctx, "fb", corral.CallRequest{Argv: []string{"cat", "in"}, FileRefs: map[string]string{"in": random}})
	if !corral.IsNotFound(never) {
		t.Fatalf("a random reference: %v", never)
	}
	_, err = x.b.Call(ctx, "fb", corral.CallRequest{Argv: []string{"cat", "in"}, FileRefs: map[string]string{"in": ref}})
	sameRefusal(t, "b reads a's artifact", err, ref, never, random)
	// B, by guessed content: the reference of the content it guesses is no more use.
	sum := sha256.Sum256([]byte("secret-A"))
	_, err = x.b.Call(ctx, "fb", corral.CallRequest{Python: "print(open('in').read())", FileRefs: map[string]string{"in": "sha256:" + hex.EncodeToString(sum[:])}})
	sameRefusal(t, "b tests for a file of guessed content", err, ref, never, random)
	// Keeping the same content in b is b's own copy; a's is untouched.
	if got, err := x.b.Call(ctx, "fb", corral.CallRequest{Script: "printf secret-A > out", Keep: []string{"out"}}); err != nil || got.Artifacts["out"] != ref {
		t.Fatalf("b keeps the same content: %+v, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(p.DataDir, "artifacts", x.bID, strings.TrimPrefix(ref, "sha256:"))); err != nil {
		t.Errorf("b's copy is not in b's store: %v", err)
	}

	// The quota: b may keep 100 bytes; a 200-byte file is refused with the limit, nothing kept.
	limit := int64(100)
	if _, err := p.Client.SetQuota(ctx, "b", corral.Quota{ArtifactBytes: &limit}); err != nil {
		t.Fatal(err)
	}
	_, err = x.b.Call(ctx, "fb", corral.CallRequest{Script: "head -c 200 /dev/zero > big; printf small > small", Keep: []string{"small", "big"}})
	var apiErr *corral.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != 429 || apiErr.Quota == nil || apiErr.Quota.Resource != "artifact_bytes" ||
		apiErr.Quota.Limit != 100 || apiErr.Quota.Project != "b" || !strings.Contains(apiErr.Message, "artifact_bytes limit 100") {
		t.Fatalf("over the artifact quota: %v (%+v)", err, apiErr)
	}
	smallSum := sha256.Sum256([]byte("small"))
	_, err = x.b.Call(ctx, "fb", corral.CallRequest{Argv: []string{"true"}, FileRefs: map[string]string{"in": "sha256:" + hex.EncodeToString(smallSum[:])}})
	if !corral.IsNotFound(err) {
		t.Errorf("a refused call kept a file: %v", err)
	}
	if _, err := x.b.Call(ctx, "fb", corral.CallRequest{Argv: []string{"true"}, Keep: []string{"x"}, KeepTTL: "25h"}); !corral.IsInvalid(err) {
		t.Errorf("keep_ttl past the maximum: %v", err)
	}
	if _, err := x.b.Call(ctx, "fb", corral.CallRequest{Argv: []string{"true"}, KeepTTL: "1m"}); !corral.IsInvalid(err) {
		t.Errorf("keep_ttl without keep: %v", err)
	}

	// A lifetime: an artifact kept for 1s is removed by the reaper and then not found.
	short, err := x.a.Call(ctx, "fa", corral.CallRequest{Script: "printf brief > out", Keep: []string{"out"}, KeepTTL: "1s"})
	if err != nil || short.Artifacts["out"] == "" {
		t.Fatalf("keep for 1s: %+v, %v", short, err)
	}
	file := filepath.Join(p.DataDir, "artifacts", x.aID, strings.TrimPrefix(short.Artifacts["out"], "sha256:"))
	eventually(t, 45*time.Second, "the expired artifact removed", func() bool {
		_, err := os.Stat(file)
		return os.IsNotExist(err)
	})
	_, err = x.a.Call(ctx, "fa", corral.CallRequest{Argv: []string{"true"}, FileRefs: map[string]string{"in": short.Artifacts["out"]}})
	sameRefusal(t, "an expired artifact", err, short.Artifacts["out"], never, random)
	// The long-lived one is still there.
	if got, err := x.a.Call(ctx, "fa", corral.CallRequest{Argv: []string{"cat", "in"}, FileRefs: map[string]string{"in": ref}}); err != nil || string(got.Stdout) != "secret-A" {
		t.Errorf("a's artifact after the expiry: %+v, %v", got, err)
	}
}
