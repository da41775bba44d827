package edge

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/build"
	"github.com/corral-dev/corral/internal/model"
)

// TestBuildConversion: what internal/build reads and sets of a layer and its image
// configuration survives the edge's conversions whole, and the configuration's JSON (part of an
// environment layer's cache key) is the API's byte for byte, set and empty; an exit arrives
// whole.
func TestBuildConversion(t *testing.T) {
	for _, c := range []struct {
		name     string
		internal reflect.Type
		api      reflect.Type
	}{
		{"ImageConfig", reflect.TypeFor[build.ImageConfig](), reflect.TypeFor[model.ImageConfig]()},
		{"Service", reflect.TypeFor[build.Service](), reflect.TypeFor[model.Service]()},
		{"Exit", reflect.TypeFor[build.Exit](), reflect.TypeFor[model.Exit]()},
	} {
		// A field the API gains must be carried by the conversion (and by the copy).
		if a, b := c.internal.NumField(), c.api.NumField(); a != b {
			t.Errorf("build.%s has %d fields, the API's %d", c.name, a, b)
		}
	}
	full := &build.ImageConfig{
		Env: []string{"PATH=/bin", "A=1"}, WorkingDir: "/work", User: "1000:1000",
		Entrypoint: []string{"/bin/sh", "-c"}, Cmd: []string{"serve"}, Labels: map[string]string{"a": "b"},
		Services: []build.Service{{Name: "jupyter", Command: []string{"jupyter", "lab"}, Env: []string{"X=1"}, Port: 8888, Ready: "/api"}},
	}
	for _, cfg := range []*build.ImageConfig{full, {Env: []string{"PATH=/bin"}}, {}} {
		api := apiImageConfig(cfg)
		a, _ := json.Marshal(cfg)
		b, _ := json.Marshal(api)
		if string(a) != string(b) {
			t.Errorf("build.ImageConfig's JSON differs from the API's:\nbuild %s\nAPI   %s", a, b)
		}
		if back := buildImageConfig(api); !reflect.DeepEqual(back, cfg) {
			t.Errorf("ImageConfig %+v comes back as %+v", cfg, back)
		}
	}
	if apiImageConfig(nil) != nil || buildImageConfig(nil) != nil {
		t.Error("a missing configuration converts to one")
	}
	l := build.Layer{Name: "env", Version: "b-1", Digest: "sha256:ab", Size: 10, Files: 2, Below: []string{"base:1"},
		ImageConfig: full, Project: "team", CreatedAt: time.Unix(1, 5).UTC()}
	api := apiLayer(l)
	if api.Kind != model.KindBase {
		t.Errorf("a build's layer is of kind %q, want base", api.Kind)
	}
	if back := buildLayer(api); !reflect.DeepEqual(back, l) {
		t.Errorf("Layer %+v comes back as %+v", l, back)
	}
	x := &agentrpc.Exit{Code: -1, Signal: "SIGKILL", TimedOut: true, OOMKilled: true, Error: "e"}
	if got, want := *buildExit(x), (build.Exit{Code: -1, Signal: "SIGKILL", TimedOut: true, OOMKilled: true, Error: "e"}); got != want {
		t.Errorf("buildExit = %+v, want %+v", got, want)
	}
}
