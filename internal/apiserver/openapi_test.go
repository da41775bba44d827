package apiserver

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestOpenAPIDocumentsRoutes: api/openapi.yaml parses as YAML, and every route the API server
// and the edge's data plane register (read from their sources) is documented there with its
// method. A route added without its documentation fails here.
func TestOpenAPIDocumentsRoutes(t *testing.T) {
	b, err := os.ReadFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("api/openapi.yaml: %v", err)
	}
	param := regexp.MustCompile(`\{[^}]+\}`)
	documented := map[string]bool{}
	for path, ops := range doc.Paths {
		for method := range ops {
			documented[strings.ToUpper(method)+" "+param.ReplaceAllString(path, "{}")] = true
		}
	}
	route := regexp.MustCompile(`\.HandleFunc\("([A-Z]+) (/v1/[^"]*)"`)
	var files []string
	for _, dir := range []string{".", "../edge"} {
		m, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		files = append(files, m...)
	}
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range route.FindAllStringSubmatch(string(src), -1) {
			n++
			key := m[1] + " " + param.ReplaceAllString(strings.TrimSuffix(m[2], "/"), "{}")
			if !documented[key] {
				t.Errorf("%s: route %s %s is not in api/openapi.yaml", f, m[1], m[2])
			}
		}
	}
	if n < 50 {
		t.Fatalf("found only %d routes in the sources: the pattern no longer matches how routes are registered", n)
	}
}
