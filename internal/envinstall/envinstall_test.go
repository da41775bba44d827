package envinstall

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/doccheck"
	"github.com/corral-dev/corral/internal/model"
	corral "github.com/corral-dev/corral/sdk/go"
)

// TestRecipes: every embedded recipe loads, names Debian packages, and declares services the
// API accepts on a layer import.
func TestRecipes(t *testing.T) {
	names := Names()
	if len(names) == 0 || names[0] != "code-interpreter" {
		t.Fatalf("Names() = %v", names)
	}
	for _, n := range names {
		r, err := Load(n)
		if err != nil {
			t.Fatalf("Load(%s): %v", n, err)
		}
		if len(r.Packages) == 0 || r.Description == "" {
			t.Errorf("%s: no packages or description", n)
		}
		// The recipe's services as the server reads them off the wire.
		var cfg model.ImageConfig
		if raw, err := json.Marshal(corral.ImageConfig{Services: r.Services}); err != nil {
			t.Fatal(err)
		} else if err := json.Unmarshal(raw, &cfg); err != nil {
			t.Fatal(err)
		}
		if err := catalog.ValidateImageConfig(&cfg); err != nil {
			t.Errorf("%s: services: %v", n, err)
		}
	}
	for _, bad := range []string{"", "nope", "../code-interpreter", "Code-Interpreter"} {
		if _, err := Load(bad); err == nil {
			t.Errorf("Load(%q) succeeded", bad)
		}
	}
}

// TestKey: a recipe's keys depend on its inputs only (the base's key among them), so that
// every host and every `make test` run finds the layer it built before; its files are outside
// the packages layer's key.
func TestKey(t *testing.T) {
	r, err := Load("code-interpreter")
	if err != nil {
		t.Fatal(err)
	}
	k1, k2, k3 := r.PackagesKey("base-a"), r.PackagesKey("base-a"), r.PackagesKey("base-b")
	if k1 != k2 || k1 == k3 || len(k1) != 16 {
		t.Errorf("keys %q %q %q: want equal for equal inputs, different for another base", k1, k2, k3)
	}
	f1, _ := r.FilesKey(k1)
	r2 := *r
	r2.raw = append(bytes.Clone(r.raw), ' ')
	if f2, _ := r2.FilesKey(k1); f2 == f1 || r2.PackagesKey("base-a") != k1 {
		t.Error("a changed recipe.json keeps its files key, or changes its packages key")
	}
	r2.Packages = append([]string{"extra"}, r.Packages...)
	if r2.PackagesKey("base-a") == k1 {
		t.Error("another package list keeps the packages key")
	}
	if f3, _ := r.FilesKey(k3); f3 == f1 {
		t.Error("the files key does not follow the packages layer")
	}
}

// TestDebianBaseScript: scripts/debian-base.sh runs the script Build embeds, so both build and
// find the same cached base.
func TestDebianBaseScript(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "scripts", "debian-base.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "internal/envinstall/debian-base.sh") {
		t.Errorf("scripts/debian-base.sh does not run internal/envinstall/debian-base.sh:\n%s", b)
	}
}

func TestPrefixWriter(t *testing.T) {
	var out bytes.Buffer
	w := &prefixWriter{w: &out, prefix: "> "}
	w.Write([]byte("a\nb"))
	w.Write([]byte("c\n"))
	w.Write([]byte("d"))
	w.Flush()
	if got, want := out.String(), "> a\n> bc\n> d\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestDocComments(t *testing.T) { doccheck.Exported(t, ".") }
