// Command kubeschema turns the Kubernetes API's OpenAPI v3 documents (api/openapi-spec/v3 of the
// k8s.io/kubernetes module) into the JSON schemas kubeconform reads in its standalone-strict
// layout: one file per kind and version, named as kubeconform's schema-location template
// `{{ .ResourceKind }}{{ .KindSuffix }}.json` expects (deployment-apps-v1.json, service-v1.json),
// with every reference inlined and unknown fields refused wherever the API lists an object's
// fields. scripts/kubeconform.sh runs it once per Kubernetes version and caches the result.
//
//	go run ./internal/deploycheck/kubeschema -spec DIR -out DIR
//
// What the API accepts and the schemas therefore allow: null for any typed field (the API
// treats it as unset), an integer or a string for IntOrString, a string or a number for
// Quantity. A type that contains itself (only apiextensions' JSONSchemaProps) is checked down to
// the first repetition and accepts anything below it.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
)

func main() {
	spec := flag.String("spec", "", "directory of the OpenAPI v3 documents (k8s.io/kubernetes's api/openapi-spec/v3)")
	out := flag.String("out", "", "directory the schemas are written to (created if missing)")
	flag.Parse()
	if *spec == "" || *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: kubeschema -spec DIR -out DIR")
		os.Exit(2)
	}
	n, err := run(*spec, *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubeschema:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "kubeschema: %d schemas written to %s\n", n, *out)
}

// run converts the documents in specDir and writes one schema file per kind into outDir.
func run(specDir, outDir string) (int, error) {
	defs, err := readDefinitions(specDir)
	if err != nil {
		return 0, err
	}
	files, err := convert(defs)
	if err != nil {
		return 0, err
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return 0, err
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(outDir, name), b, 0o644); err != nil {
			return 0, err
		}
	}
	return len(files), nil
}

// readDefinitions merges components.schemas of every document in dir. The documents are one
// per API group version and repeat the shared types (ObjectMeta in each): a name defined two
// different ways is an error, not a silent choice.
func readDefinitions(dir string) (map[string]map[string]any, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("no OpenAPI documents (*.json) in %s", dir)
	}
	defs := map[string]map[string]any{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var doc struct {
			Components struct {
				Schemas map[string]map[string]any `json:"schemas"`
			} `json:"components"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		for name, s := range doc.Components.Schemas {
			if old, ok := defs[name]; ok && !reflect.DeepEqual(old, s) {
				return nil, fmt.Errorf("read %s: %s differs from its definition in another document", p, name)
			}
			defs[name] = s
		}
	}
	return defs, nil
}

// gvk is one entry of a definition's x-kubernetes-group-version-kind.
type gvk struct{ Group, Version, Kind string }

// apiVersion is the manifest's apiVersion for g ("v1" for the core group, "apps/v1" otherwise).
func (g gvk) apiVersion() string {
	if g.Group == "" {
		return g.Version
	}
	return g.Group + "/" + g.Version
}

// fileName is the name kubeconform's `{{ .ResourceKind }}{{ .KindSuffix }}.json` gives g:
// the lowercased kind, the group's first label and the version ("deployment-apps-v1.json",
// "ingress-networking-v1.json", "service-v1.json"); see schemaPath in kubeconform's
// pkg/registry.
func (g gvk) fileName() string {
	suffix := "-" + strings.ToLower(g.Version)
	if g.Group != "" {
		first, _, _ := strings.Cut(g.Group, ".")
		suffix = "-" + strings.ToLower(first) + suffix
	}
	return strings.ToLower(g.Kind) + suffix + ".json"
}

// convert returns the schema files (name -> JSON) of every definition that is a kind.
func convert(defs map[string]map[string]any) (map[string][]byte, error) {
	names := make([]string, 0, len(defs))
	for name := range defs {
		names = append(names, name)
	}
	sort.Strings(names)
	files := map[string][]byte{}
	from := map[string]string{} // file name -> the definition it came from
	for _, name := range names {
		kinds, err := kindsOf(defs[name])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		for _, k := range kinds {
			file := k.fileName()
			if prev, ok := from[file]; ok {
				return nil, fmt.Errorf("%s and %s both map to %s", prev, name, file)
			}
			from[file] = name
			c := converter{defs: defs, open: map[string]bool{name: true}}
			s, err := c.schema(defs[name], false)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			props, _ := s["properties"].(map[string]any)
			if props == nil {
				return nil, fmt.Errorf("%s: a kind without properties", name)
			}
			// A manifest names exactly this kind: the schema file is chosen by these two fields, so
			// they are pinned rather than left as any string.
			props["apiVersion"] = map[string]any{"type": "string", "enum": []any{k.apiVersion()}}
			props["kind"] = map[string]any{"type": "string", "enum": []any{k.Kind}}
			s["$schema"] = "http://json-schema.org/draft-04/schema#"
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(false)
			if err := enc.Encode(s); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			files[file] = buf.Bytes()
		}
	}
	if len(files) == 0 {
		return nil, errors.New("no definition names a kind (x-kubernetes-group-version-kind)")
	}
	return files, nil
}

// kindsOf reads a definition's x-kubernetes-group-version-kind (absent: not a kind).
func kindsOf(def map[string]any) ([]gvk, error) {
	raw, ok := def["x-kubernetes-group-version-kind"]
	if !ok {
		return nil, nil
	}
	list, ok := raw.([]any)
	if !ok {
		return nil, fmt.Errorf("x-kubernetes-group-version-kind is %T, want a list", raw)
	}
	var out []gvk
	for _, e := range list {
		m, _ := e.(map[string]any)
		g, _ := m["group"].(string)
		v, _ := m["version"].(string)
		k, _ := m["kind"].(string)
		if v == "" || k == "" {
			return nil, fmt.Errorf("x-kubernetes-group-version-kind entry %v lacks a version or kind", e)
		}
		out = append(out, gvk{g, v, k})
	}
	return out, nil
}

// converter inlines one kind's schema.
type converter struct {
	defs map[string]map[string]any
	open map[string]bool // definitions being inlined on the current path (cycle guard)
}

// refPrefix starts every reference in the v3 documents.
const refPrefix = "#/components/schemas/"

// schema converts one OpenAPI schema object. nullable lets the value be null as well as its
// type; it is off inside oneOf, whose branches must stay mutually exclusive.
func (c *converter) schema(in map[string]any, nullable bool) (map[string]any, error) {
	if ref, ok := refOf(in); ok {
		return c.ref(ref, nullable)
	}
	out := map[string]any{}
	for k, v := range in {
		switch {
		case k == "type":
			t, ok := v.(string)
			if !ok {
				return nil, fmt.Errorf("type %v: want a string", v)
			}
			if nullable {
				out["type"] = []any{t, "null"}
			} else {
				out["type"] = t
			}
		case k == "format":
			// int-or-string is not a JSON Schema format; the oneOf beside it says what it means.
			if v != "int-or-string" {
				out["format"] = v
			}
		case k == "required" || k == "enum":
			out[k] = v
		case k == "properties":
			m, ok := v.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("properties is %T", v)
			}
			props := map[string]any{}
			for name, p := range m {
				ps, ok := p.(map[string]any)
				if !ok {
					return nil, fmt.Errorf("property %s is %T", name, p)
				}
				s, err := c.schema(ps, true)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", name, err)
				}
				props[name] = s
			}
			out["properties"] = props
		case k == "items" || k == "additionalProperties":
			switch x := v.(type) {
			case bool:
				out[k] = x
			case map[string]any:
				s, err := c.schema(x, true)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", k, err)
				}
				out[k] = s
			default:
				return nil, fmt.Errorf("%s is %T", k, v)
			}
		case k == "oneOf" || k == "anyOf" || k == "allOf":
			list, ok := v.([]any)
			if !ok {
				return nil, fmt.Errorf("%s is %T", k, v)
			}
			var branches []any
			for _, b := range list {
				bs, ok := b.(map[string]any)
				if !ok {
					return nil, fmt.Errorf("%s branch is %T", k, b)
				}
				s, err := c.schema(bs, nullable && k != "oneOf")
				if err != nil {
					return nil, err
				}
				branches = append(branches, s)
			}
			out[k] = branches
		case k == "description" || k == "default" || k == "example" || strings.HasPrefix(k, "x-"):
			// Documentation and hints for clients and the API server's merge logic: no
			// constraint on a manifest.
		default:
			// A keyword this converter does not know may be a constraint it would silently
			// drop: stop instead, so a new Kubernetes version is looked at.
			return nil, fmt.Errorf("unsupported schema keyword %q", k)
		}
	}
	if _, ok := out["properties"]; ok {
		if _, ok := out["additionalProperties"]; !ok {
			out["additionalProperties"] = false
		}
	}
	return out, nil
}

// refOf returns the definition a schema stands for: a plain $ref, or the v3 documents' wrapper
// {"allOf": [{"$ref": ...}], "default": ..., "description": ...}, whose siblings constrain nothing.
func refOf(in map[string]any) (string, bool) {
	if r, ok := in["$ref"].(string); ok {
		return r, true
	}
	all, ok := in["allOf"].([]any)
	if !ok || len(all) != 1 {
		return "", false
	}
	one, _ := all[0].(map[string]any)
	if len(one) != 1 {
		return "", false
	}
	r, ok := one["$ref"].(string)
	if !ok {
		return "", false
	}
	for k := range in {
		if k != "allOf" && k != "default" && k != "description" && !strings.HasPrefix(k, "x-") {
			return "", false
		}
	}
	return r, true
}

// ref inlines the definition ref names; a definition already being inlined on this path (a type
// that contains itself) becomes an empty schema, which accepts anything.
func (c *converter) ref(ref string, nullable bool) (map[string]any, error) {
	name, ok := strings.CutPrefix(ref, refPrefix)
	if !ok {
		return nil, fmt.Errorf("reference %q is not local to the document", ref)
	}
	def, ok := c.defs[name]
	if !ok {
		return nil, fmt.Errorf("reference to an unknown definition %s", name)
	}
	if c.open[name] {
		return map[string]any{}, nil
	}
	c.open[name] = true
	defer delete(c.open, name)
	s, err := c.schema(def, nullable)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return s, nil
}
