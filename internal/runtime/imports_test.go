package runtime_test

import (
	"os/exec"
	"reflect"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/runtime/backends"
)

const module = "github.com/corral-dev/corral"

// TestImportRules keeps the seam a seam: no package outside internal/runtime/... imports a
// backend package (they speak internal/runtime; internal/runtime/backends wires the backends),
// no backend imports another, the contract imports none, and nothing under internal/runtime
// imports the SDK (the API's wire types; the edge converts at its boundary). The backends are the packages of
// the factories in backends.All, so a new backend is checked from its registration on.
func TestImportRules(t *testing.T) {
	isBackend := map[string]bool{}
	for _, b := range backends.All {
		fn := goruntime.FuncForPC(reflect.ValueOf(b.New).Pointer()).Name() // <pkg>.Factory
		pkg := fn[:strings.LastIndex(fn, ".")]
		if !strings.HasPrefix(pkg, module+"/internal/runtime/") {
			t.Errorf("backend %s: its factory %s is not in a package under internal/runtime", b.Name, fn)
		}
		isBackend[pkg] = true
	}
	if len(isBackend) < 2 {
		t.Fatalf("found backend packages %v; want runc's and qemu's at least", isBackend)
	}
	out, err := exec.Command("go", "list", "-e", "-f",
		`{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}`, module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg, imports := f[0], f[1:]
		inRuntime := strings.HasPrefix(pkg, module+"/internal/runtime/")
		for _, imp := range imports {
			if (pkg == module+"/internal/runtime" || inRuntime) && imp == module+"/sdk/go" {
				t.Errorf("%s imports the SDK: the runtime speaks its own types (internal/runtime), the edge converts", pkg)
			}
			if !isBackend[imp] || imp == pkg {
				continue
			}
			switch {
			case pkg == module+"/internal/runtime":
				t.Errorf("the contract %s imports the backend %s", pkg, imp)
			case isBackend[pkg]:
				t.Errorf("backend %s imports backend %s: share code through a package under internal/runtime that is no backend", pkg, imp)
			case !inRuntime:
				t.Errorf("%s imports the backend %s: use internal/runtime (and internal/runtime/backends to wire)", pkg, imp)
			}
		}
		checked++
	}
	if checked < 50 {
		t.Fatalf("go list gave %d packages; want the whole module", checked)
	}
}
