package e2e

import (
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestE2BSDKTemplateBuild drives E2B template builds through the gateway with the real e2b
// SDK's template builder (test/e2b/template.mjs): build, a sandbox of the template, a cached
// rebuild, a template on a template, and the refusals; then E2B's CLI, `e2b template create`
// of an e2b.Dockerfile (test/e2b/template-cli.mjs). Corral's view is checked here: the
// template is an environment, the builds are Corral builds and the rebuild reused every
// layer. What the SDK never sends is TestRedTeamE2BTemplate's.
func TestE2BSDKTemplateBuild(t *testing.T) {
	needRoot(t)
	e2bAddr := freePort(t)
	p := withBase(t, "--e2b-listen", e2bAddr, "--e2b-domain", "e2b.test")
	run := randHex(4)
	key := withE2BKey(t, p, "token", "e2b-key")
	last := runE2BScript(t, key, e2bAddr, "template.mjs", "base:test", run)
	if last.Sandbox == "" {
		t.Fatal("the script reported no sandbox")
	}

	name := "tpl-" + run
	env, err := p.Client.Environment(t.Context(), name)
	if err != nil {
		t.Fatalf("the template's environment: %v", err)
	}
	builds, err := p.Client.Builds(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var ours []corral.Build
	for _, b := range builds {
		if b.Name == name {
			ours = append(ours, b)
		}
	}
	if len(ours) != 2 || ours[0].State != corral.BuildSucceeded || ours[1].State != corral.BuildSucceeded {
		t.Fatalf("want two succeeded Corral builds of %s, got %+v", name, ours)
	}
	if env.Base != ours[1].Layer {
		t.Fatalf("environment base %s, want the last build's layer %s", env.Base, ours[1].Layer)
	}
	for i, b := range ours {
		for _, s := range b.Steps {
			if s.Kind == "config" {
				continue
			}
			if want := map[int]string{0: "done", 1: "cached"}[i]; s.State != want {
				t.Errorf("build %d step %d (%s): %s, want %s", i+1, s.N, s.Text, s.State, want)
			}
		}
	}

	// E2B's CLI: `e2b template create` builds e2b.Dockerfile through the same calls.
	t.Run("cli", func(t *testing.T) {
		runE2BScript(t, key, e2bAddr, "template-cli.mjs", "base:test", run)
		if _, err := p.Client.Environment(t.Context(), "tpl-cli-"+run); err != nil {
			t.Fatalf("the CLI's template: %v", err)
		}
	})
}
