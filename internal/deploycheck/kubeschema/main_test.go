package main

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestFileName(t *testing.T) {
	tests := []struct {
		g    gvk
		want string
	}{
		{gvk{"apps", "v1", "Deployment"}, "deployment-apps-v1.json"},
		{gvk{"", "v1", "Service"}, "service-v1.json"},
		{gvk{"networking.k8s.io", "v1", "Ingress"}, "ingress-networking-v1.json"},
		{gvk{"policy", "v1", "PodDisruptionBudget"}, "poddisruptionbudget-policy-v1.json"},
	}
	for _, tt := range tests {
		if got := tt.g.fileName(); got != tt.want {
			t.Errorf("%+v: got %s, want %s", tt.g, got, tt.want)
		}
	}
}

// defs parses definitions written as JSON.
func defs(t *testing.T, s string) map[string]map[string]any {
	t.Helper()
	var d map[string]map[string]any
	if err := json.Unmarshal([]byte(s), &d); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestConvert(t *testing.T) {
	in := defs(t, `{
	  "x.Widget": {
	    "type": "object",
	    "description": "a kind",
	    "x-kubernetes-group-version-kind": [{"group": "example.io", "version": "v1", "kind": "Widget"}],
	    "properties": {
	      "apiVersion": {"type": "string"},
	      "kind": {"type": "string"},
	      "metadata": {"allOf": [{"$ref": "#/components/schemas/x.Meta"}], "default": {}, "description": "d"},
	      "spec": {"$ref": "#/components/schemas/x.Spec"}
	    }
	  },
	  "x.Meta": {"type": "object", "properties": {"name": {"type": "string", "description": "d"}}},
	  "x.Spec": {
	    "type": "object",
	    "required": ["size"],
	    "properties": {
	      "size": {"$ref": "#/components/schemas/x.IntOrString"},
	      "child": {"$ref": "#/components/schemas/x.Spec"},
	      "labels": {"type": "object", "additionalProperties": {"type": "string"}},
	      "raw": {"type": "object"}
	    }
	  },
	  "x.IntOrString": {"format": "int-or-string", "oneOf": [{"type": "integer"}, {"type": "string"}]}
	}`)
	files, err := convert(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 {
		t.Fatalf("got %d files, want 1 (widget-example-v1.json)", len(files))
	}
	var got any
	if err := json.Unmarshal(files["widget-example-v1.json"], &got); err != nil {
		t.Fatal(err)
	}
	// The root is an object; fields may be null; references are inlined; listed fields close
	// an object, a map (additionalProperties) or an object with no fields stays open; the type
	// inside itself accepts anything; IntOrString's format, which is no JSON Schema format, goes.
	var want any
	json.Unmarshal([]byte(`{
	  "$schema": "http://json-schema.org/draft-04/schema#",
	  "type": "object",
	  "additionalProperties": false,
	  "properties": {
	    "apiVersion": {"type": "string", "enum": ["example.io/v1"]},
	    "kind": {"type": "string", "enum": ["Widget"]},
	    "metadata": {"type": ["object", "null"], "additionalProperties": false,
	      "properties": {"name": {"type": ["string", "null"]}}},
	    "spec": {"type": ["object", "null"], "additionalProperties": false, "required": ["size"],
	      "properties": {
	        "size": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
	        "child": {},
	        "labels": {"type": ["object", "null"], "additionalProperties": {"type": ["string", "null"]}},
	        "raw": {"type": ["object", "null"]}
	      }}
	  }
	}`), &want)
	if !reflect.DeepEqual(got, want) {
		g, _ := json.MarshalIndent(got, "", "  ")
		w, _ := json.MarshalIndent(want, "", "  ")
		t.Errorf("got\n%s\nwant\n%s", g, w)
	}
}

func TestConvertRefuses(t *testing.T) {
	tests := []struct {
		name, defs, wantErr string
	}{
		{"unknown keyword", `{"x.K": {"type": "object", "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "K"}],
		  "properties": {"n": {"type": "integer", "maximum": 3}}}}`, `unsupported schema keyword "maximum"`},
		{"unknown reference", `{"x.K": {"type": "object", "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "K"}],
		  "properties": {"n": {"$ref": "#/components/schemas/x.Missing"}}}}`, "unknown definition x.Missing"},
		{"two definitions, one file", `{
		  "a.K": {"type": "object", "x-kubernetes-group-version-kind": [{"group": "a.io", "version": "v1", "kind": "K"}], "properties": {}},
		  "b.K": {"type": "object", "x-kubernetes-group-version-kind": [{"group": "a.example", "version": "v1", "kind": "K"}], "properties": {}}}`,
			"both map to k-a-v1.json"},
		{"no kinds", `{"x.T": {"type": "string"}}`, "no definition names a kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := convert(defs(t, tt.defs))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("got error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}
