package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestEnvironmentsAndTags: a saved environment composes base, workspace and toolkits by name; a
// movable tag (tk:latest) resolves when a sandbox is created, and the sandbox records the version.
func TestEnvironmentsAndTags(t *testing.T) {
	p := withBase(t)
	ctx := context.Background()
	mk := func(content string) string {
		dir := t.TempDir()
		os.MkdirAll(filepath.Join(dir, "opt/tk"), 0o755)
		os.WriteFile(filepath.Join(dir, "opt/tk/version"), []byte(content), 0o644)
		return dir
	}
	p.importDir("tk", "1", corral.KindToolkit, mk("one\n"))
	p.importDir("tk", "2", corral.KindToolkit, mk("two\n"))
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "README"), []byte("task\n"), 0o644)
	p.importDir("repo", "v1", corral.KindWorkspace, ws)

	if _, err := p.Client.TagLayer(ctx, "tk", "latest", "1"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Client.TagLayer(ctx, "tk", "2", "1"); !corral.IsConflict(err) {
		t.Errorf("a tag shadowing a version: %v, want conflict", err)
	}
	if _, err := p.Client.TagLayer(ctx, "tk", "edge", "9"); !corral.IsNotFound(err) {
		t.Errorf("a tag to an unknown version: %v, want not found", err)
	}
	if _, stderr, code := p.cli("", "env", "create", "task", "--base", "base:test", "--workspace", "repo:v1", "--toolkit", "tk:latest"); code != 0 {
		t.Fatalf("corral env create: %s", stderr)
	}
	// Saving the same composition again is a no-op; another one under the name is refused.
	if _, err := p.Client.SaveEnvironment(ctx, corral.Environment{Name: "task", Base: "base:test", Workspace: "repo:v1", Toolkits: []string{"tk:latest"}}); err != nil {
		t.Errorf("same environment again: %v", err)
	}
	if _, err := p.Client.SaveEnvironment(ctx, corral.Environment{Name: "task", Base: "base:test"}); !corral.IsConflict(err) {
		t.Errorf("other composition under a taken name: %v, want conflict", err)
	}
	for _, bad := range []corral.Environment{{Name: "x"}, {Name: "Bad Name", Base: "base:test"}, {Name: "y", Base: "base:nope"},
		{Name: "z", Base: "base:test", Toolkits: []string{"repo:v1"}}} {
		if _, err := p.Client.SaveEnvironment(ctx, bad); !corral.IsInvalid(err) {
			t.Errorf("SaveEnvironment(%+v): %v, want invalid", bad, err)
		}
	}

	id, stderr, code := p.cli("", "create", "--env", "task", "--env", "MODE=test")
	if code != 0 {
		t.Fatalf("corral create --env task: %s", stderr)
	}
	id = strings.TrimSpace(id)
	defer p.Client.DeleteSandbox(ctx, id)
	sb, err := p.Client.GetSandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if sb.Environment != "task" || sb.Base != "base:test" || sb.Workspace != "repo:v1" || !slices.Equal(sb.Toolkits, []string{"tk:1"}) {
		t.Fatalf("sandbox from the environment: env %q base %q workspace %q toolkits %v (the tag must be recorded as the version)",
			sb.Environment, sb.Base, sb.Workspace, sb.Toolkits)
	}
	if got := p.sh(id, "cat /opt/tk/version /workspace/README 2>/dev/null || cat /opt/tk/version /README; echo $MODE"); !strings.HasPrefix(got, "one\n") || !strings.HasSuffix(got, "test\n") {
		t.Fatalf("sandbox files and env: %q", got)
	}
	// Moving the tag changes what the environment makes next, not what exists.
	if _, err := p.Client.TagLayer(ctx, "tk", "latest", "2"); err != nil {
		t.Fatal(err)
	}
	sb2 := p.create(corral.CreateRequest{Environment: "task"})
	if !slices.Equal(sb2.Toolkits, []string{"tk:2"}) || p.sh(sb2.ID, "cat /opt/tk/version") != "two\n" {
		t.Fatalf("after moving the tag: toolkits %v", sb2.Toolkits)
	}
	if got := p.sh(id, "cat /opt/tk/version"); got != "one\n" {
		t.Fatalf("the existing sandbox changed: %q", got)
	}
	if _, err := p.Client.CreateSandbox(ctx, corral.CreateRequest{Environment: "task", Base: "base:test"}); !corral.IsInvalid(err) {
		t.Errorf("environment plus base: %v, want invalid", err)
	}
	if _, err := p.Client.CreateSandbox(ctx, corral.CreateRequest{Environment: "nope"}); !corral.IsInvalid(err) {
		t.Errorf("unknown environment: %v, want invalid", err)
	}
	if out, _, _ := p.cli("", "layer", "ls", "--name", "tk"); !strings.Contains(out, "latest") {
		t.Errorf("layer ls does not show the tag: %s", out)
	}
	if err := p.Client.DeleteEnvironment(ctx, "task"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Client.Environment(ctx, "task"); !corral.IsNotFound(err) {
		t.Errorf("deleted environment: %v", err)
	}

	// Deleting versions: refused while a tag names it; a version a sandbox still runs on loses its
	// record but keeps its tree until the sandbox is gone and GC runs.
	if _, err := p.Client.DeleteLayer(ctx, "tk", "2"); !corral.IsConflict(err) || !strings.Contains(err.Error(), "latest") {
		t.Errorf("delete of a tagged version: %v, want a conflict naming the tag", err)
	}
	if err := p.Client.DeleteTag(ctx, "tk", "latest"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Client.DeleteLayer(ctx, "tk", "1"); err != nil {
		t.Fatal(err)
	}
	if got := p.sh(id, "cat /opt/tk/version"); got != "one\n" {
		t.Fatalf("a sandbox on a deleted version lost its files: %q", got)
	}
	for _, s := range []string{id, sb2.ID} {
		if _, err := p.Client.DeleteSandbox(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	gc, err := p.Client.GCLayers(ctx)
	if err != nil || gc.Removed != 1 {
		t.Errorf("GC after the last user of tk:1 went: %+v, %v; want 1 tree removed", gc, err)
	}
	if _, err := p.Client.DeleteLayer(ctx, "tk", "2"); err != nil {
		t.Fatal(err)
	}
	if gc, err := p.Client.GCLayers(ctx); err != nil || gc.Removed != 0 {
		t.Errorf("GC with nothing to collect: %+v, %v", gc, err)
	}
	if _, err := p.Client.Layer(ctx, "tk", "1"); !corral.IsNotFound(err) {
		t.Errorf("deleted version: %v", err)
	}
	if _, err := p.Client.DeleteLayer(ctx, "base", "test"); err != nil {
		t.Errorf("delete of an unused base: %v", err)
	}
}
