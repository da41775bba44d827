package e2b

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/build"
	corral "github.com/corral-dev/corral/sdk/go"
)

func ptr[T any](v T) *T { return &v }

const testHash = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// TestPlanTemplate checks the translation of E2B steps into a Dockerfile, and that what it
// writes is a Dockerfile Corral's builder plans as intended.
func TestPlanTemplate(t *testing.T) {
	tests := []struct {
		name     string
		in       templateStart
		baseUser string
		want     string
		stepOf   []string
		noCache  bool
	}{
		{
			name: "every step",
			in: templateStart{Steps: []templateStep{
				{Type: "ENV", Args: []string{"A", `say "hi" \ there`, "B", "2"}},
				{Type: "WORKDIR", Args: []string{"/app"}},
				{Type: "RUN", Args: []string{"echo made > made.txt\necho two"}},
				{Type: "COPY", Args: []string{"hello.txt", "/app/hello.txt", "", ""}, FilesHash: testHash},
				{Type: "COPY", Args: []string{"dir", "out/", "1000:1000", "0640"}, FilesHash: testHash},
				{Type: "USER", Args: []string{"user"}},
			}},
			want: "FROM base:test\n" +
				`ENV A="say \"hi\" \\ there" B="2"` + "\n" +
				"WORKDIR /app\n" +
				`RUN ["/bin/sh","-c","echo made \u003e made.txt\necho two"]` + "\n" +
				`COPY ["hello.txt","/app/hello.txt"]` + "\n" +
				`COPY --chown=1000:1000 --chmod=0640 ["dir","out/"]` + "\n" +
				"USER user\n",
			stepOf: []string{"base", "1", "2", "3", "4", "5", "6"},
		},
		{
			name: "a RUN as another user goes back to the current one",
			in: templateStart{Steps: []templateStep{
				{Type: "RUN", Args: []string{"apt-get update", "root"}},
				{Type: "USER", Args: []string{"user"}},
				{Type: "RUN", Args: []string{"id", "root"}},
				{Type: "RUN", Args: []string{"id", "user"}},
			}},
			baseUser: "app",
			want: "FROM base:test\nUSER root\nRUN [\"/bin/sh\",\"-c\",\"apt-get update\"]\nUSER app\n" +
				"USER user\nUSER root\nRUN [\"/bin/sh\",\"-c\",\"id\"]\nUSER user\nRUN [\"/bin/sh\",\"-c\",\"id\"]\n",
			stepOf: []string{"base", "1", "1", "1", "2", "3", "3", "3", "4"},
		},
		{
			name:    "force on a step builds without the cache",
			in:      templateStart{Steps: []templateStep{{Type: "RUN", Args: []string{"true"}, Force: true}}},
			want:    "FROM base:test\nRUN [\"/bin/sh\",\"-c\",\"true\"]\n",
			stepOf:  []string{"base", "1"},
			noCache: true,
		},
		{
			name:    "force on the build",
			in:      templateStart{Force: ptr(true)},
			want:    "FROM base:test\n",
			stepOf:  []string{"base"},
			noCache: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := planTemplate(tt.in, "base:test", tt.baseUser)
			if err != nil {
				t.Fatal(err)
			}
			if p.dockerfile != tt.want {
				t.Errorf("dockerfile:\n%s\nwant:\n%s", p.dockerfile, tt.want)
			}
			if strings.Join(p.stepOf, ",") != strings.Join(tt.stepOf, ",") {
				t.Errorf("stepOf %v, want %v", p.stepOf, tt.stepOf)
			}
			if p.noCache != tt.noCache {
				t.Errorf("noCache %v, want %v", p.noCache, tt.noCache)
			}
			// Corral's builder reads it back as meant.
			df, err := build.Parse(p.dockerfile)
			if err != nil {
				t.Fatalf("build.Parse: %v", err)
			}
			if got := len(df.Instructions); got != len(tt.stepOf) {
				t.Errorf("%d instructions, want %d", got, len(tt.stepOf))
			}
		})
	}
}

// TestPlanTemplateEnvAndCopyPlanned plans the translation with Corral's planner against a
// context, checking the values ENV and COPY end up with.
func TestPlanTemplateEnvAndCopyPlanned(t *testing.T) {
	p, err := planTemplate(templateStart{Steps: []templateStep{
		{Type: "ENV", Args: []string{"A", `say "hi" \ there`}},
		{Type: "WORKDIR", Args: []string{"/app"}},
		{Type: "COPY", Args: []string{"hello.txt", "copied.txt"}, FilesHash: testHash},
	}}, "base:test", "")
	if err != nil {
		t.Fatal(err)
	}
	df, err := build.Parse(p.dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "hello.txt", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg})
	tw.Write([]byte("hi"))
	tw.Close()
	bctx, err := build.ReadContext(&tb, t.TempDir(), 1<<20, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer bctx.Close()
	plan, err := build.MakePlan(df, nil, nil, bctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(plan.Config.Env, ","); got != `A=say "hi" \ there` {
		t.Errorf("env %q", got)
	}
	cp := plan.Steps[3]
	if cp.DestDir != "/app" || len(cp.Files) != 1 || cp.Files[0].Rel != "copied.txt" {
		t.Errorf("copy step: dest %s files %+v", cp.DestDir, cp.Files)
	}
}

func TestPlanTemplateRefusals(t *testing.T) {
	tests := []struct {
		name  string
		step  templateStep
		field string
	}{
		{"copy source with ..", templateStep{Type: "COPY", Args: []string{"../etc/passwd", "/x"}, FilesHash: testHash}, "steps[0].args[0]"},
		{"copy source with .. inside", templateStep{Type: "COPY", Args: []string{"a/../../b", "/x"}, FilesHash: testHash}, "steps[0].args[0]"},
		{"absolute copy source", templateStep{Type: "COPY", Args: []string{"/etc/passwd", "/x"}, FilesHash: testHash}, "steps[0].args[0]"},
		{"copy without hash", templateStep{Type: "COPY", Args: []string{"a", "/x"}}, "steps[0].filesHash"},
		{"copy with bad mode", templateStep{Type: "COPY", Args: []string{"a", "/x", "", "999"}, FilesHash: testHash}, "steps[0].args[3]"},
		{"copy with bad user", templateStep{Type: "COPY", Args: []string{"a", "/x", "Bad User"}, FilesHash: testHash}, "steps[0].args[2]"},
		{"empty run", templateStep{Type: "RUN", Args: []string{" "}}, "steps[0].args"},
		{"run with bad user", templateStep{Type: "RUN", Args: []string{"true", "x y"}}, "steps[0].args[1]"},
		{"odd env", templateStep{Type: "ENV", Args: []string{"A"}}, "steps[0].args"},
		{"bad env name", templateStep{Type: "ENV", Args: []string{"A-B", "1"}}, "steps[0].args[0]"},
		{"env value with a newline", templateStep{Type: "ENV", Args: []string{"A", "1\n2"}}, "steps[0].args[1]"},
		{"workdir with a newline", templateStep{Type: "WORKDIR", Args: []string{"/a\nRUN evil"}}, "steps[0].args[0]"},
		{"NUL", templateStep{Type: "RUN", Args: []string{"a\x00b"}}, "steps[0].args[0]"},
		{"unknown type", templateStep{Type: "ADD", Args: []string{"a", "b"}}, "steps[0].type"},
		{"files on a run", templateStep{Type: "RUN", Args: []string{"true"}, FilesHash: testHash}, "steps[0].filesHash"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := planTemplate(templateStart{Steps: []templateStep{tt.step}}, "base:test", "")
			ae, ok := err.(*apiError)
			if !ok || ae.status != http.StatusBadRequest || !strings.HasPrefix(ae.msg, tt.field+": ") {
				t.Fatalf("got %v, want a 400 about %s", err, tt.field)
			}
		})
	}
}

func TestImageLayerRef(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"debian:bookworm", "debian:bookworm"},
		{"ubuntu", "ubuntu:latest"},
		{"docker.io/library/python:3", "python:3"},
		{"library/node:lts", "node:lts"},
		{"base:test", "base:test"},
	} {
		if got, err := imageLayerRef(tt.in); err != nil || got != tt.want {
			t.Errorf("imageLayerRef(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	for _, in := range []string{"ghcr.io/x/y:1", "localhost:5000/a", "oven/bun:latest", "debian@sha256:" + testHash, "Debian:12", "a:b/c"} {
		if got, err := imageLayerRef(in); err == nil {
			t.Errorf("imageLayerRef(%q) = %q, want an error", in, got)
		}
	}
}

func TestBuildStatusMapping(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	stepOf := []string{"base", "1", "2", "2", "2"}
	failed := corral.Build{Name: "t", State: corral.BuildFailed, CreatedAt: at,
		Error: `step 4 (RUN ["/bin/sh","-c","exit 3"]): the command failed: exit code 3`,
		Steps: []corral.BuildStep{{N: 1, State: "done"}, {N: 2, State: "cached"}, {N: 3, State: "done"}, {N: 4, State: "failed"}, {N: 5, State: "pending"}}}
	events := []corral.BuildEvent{
		{Type: "step", Step: 2, Text: "Step 2/5: RUN x CACHED", Cached: true},
		{Type: "step", Step: 4, Text: "Step 4/5: RUN y"},
		{Type: "log", Step: 4, Data: []byte("about to fail\n")},
		{Type: "end", Build: &failed},
	}
	entries := buildLogEntries(events, failed, stepOf)
	if len(entries) != 4 || entries[2].Message != "about to fail" || entries[2].Step != "2" || entries[3].Level != "error" {
		t.Fatalf("entries %+v", entries)
	}
	status, reason := statusOf(failed, entries, stepOf)
	if status != "error" || reason["step"] != "2" || !strings.HasPrefix(reason["message"].(string), `steps[1] (RUN`) {
		t.Fatalf("status %s reason %v", status, reason)
	}
	if related := reason["logEntries"].([]buildLogEntry); len(related) != 2 {
		t.Errorf("reason's entries %+v", related)
	}
	for state, want := range map[string]string{corral.BuildRunning: "building", corral.BuildSucceeded: "ready"} {
		if got, _ := statusOf(corral.Build{State: state}, nil, stepOf); got != want {
			t.Errorf("%s: %s, want %s", state, got, want)
		}
	}
}

func TestBuildErrorNamesTheStep(t *testing.T) {
	err := buildError(&corral.APIError{Status: 400, Field: "dockerfile", Message: "dockerfile: line 3: COPY source \"x\" is not in the build context"}, []string{"base", "1", "2"})
	if ae, ok := err.(*apiError); !ok || ae.msg != `steps[1]: COPY source "x" is not in the build context` {
		t.Fatalf("got %v", err)
	}
}

// TestTemplateUploads drives request, upload link and upload: a gzipped tar is kept and then
// present; an entry leaving the context, a device node, a bad or expired signature and another
// caller's template are refused.
func TestTemplateUploads(t *testing.T) {
	h := newHarness(t)
	gw := h.gw
	defer gw.Close()
	srv := struct{ URL string }{h.url}
	k1 := h.fake.Token
	user, err := corral.New(h.fake.URL, h.fake.Token).CreateToken(t.Context(), corral.TokenRequest{Project: "/", Role: corral.RoleUser})
	if err != nil {
		t.Fatal(err)
	}
	do := func(method, url, key string, body []byte, want int) map[string]any {
		t.Helper()
		req, _ := http.NewRequest(method, url, bytes.NewReader(body))
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			t.Fatalf("%s %s: %d, want %d: %s", method, url, resp.StatusCode, want, b)
		}
		var out map[string]any
		json.Unmarshal(b, &out)
		return out
	}
	mkTar := func(gz bool, hdrs ...*tar.Header) []byte {
		var b bytes.Buffer
		var w io.Writer = &b
		var zw *gzip.Writer
		if gz {
			zw = gzip.NewWriter(&b)
			w = zw
		}
		tw := tar.NewWriter(w)
		for _, h := range hdrs {
			tw.WriteHeader(h)
			if h.Typeflag == tar.TypeReg {
				tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
			}
		}
		tw.Close()
		if zw != nil {
			zw.Close()
		}
		return b.Bytes()
	}

	do("POST", srv.URL+"/v3/templates", k1, []byte(`{"name":"tpl:v1"}`), http.StatusBadRequest)
	do("POST", srv.URL+"/v3/templates", k1, []byte(`{"name":"tpl","cpuCount":4}`), http.StatusBadRequest)
	do("POST", srv.URL+"/v3/templates", k1, []byte(`{"name":"tpl","memoryMB":2048}`), http.StatusBadRequest)
	do("POST", srv.URL+"/v3/templates", k1, []byte(`{"name":"tpl","tags":["v1"]}`), http.StatusBadRequest)
	do("POST", srv.URL+"/v3/templates", k1, []byte(`{"name":"Tpl"}`), http.StatusBadRequest)
	do("POST", srv.URL+"/v3/templates", "", []byte(`{"name":"tpl"}`), http.StatusUnauthorized)
	do("POST", srv.URL+"/v3/templates", "crl_unknown", []byte(`{"name":"tpl"}`), http.StatusUnauthorized)
	if out := do("POST", srv.URL+"/v3/templates", user.Token, []byte(`{"name":"tpl"}`), http.StatusForbidden); !strings.Contains(out["message"].(string), "layer.publish") {
		t.Errorf("a key that may not build: %v", out)
	}
	// Nothing was kept for them: no upload area.
	do("GET", srv.URL+"/templates/tpl/files/"+testHash, user.Token, nil, http.StatusNotFound)
	// What E2B's CLI sends when the user gave no resources: E2B's defaults.
	do("POST", srv.URL+"/v3/templates", k1, []byte(`{"name":"tpl","cpuCount":2,"memoryMB":1024}`), http.StatusAccepted)
	out := do("POST", srv.URL+"/v3/templates", k1, []byte(`{"name":"tpl"}`), http.StatusAccepted)
	if out["templateID"] != "tpl" || out["buildID"] == "" {
		t.Fatalf("request: %v", out)
	}
	do("GET", srv.URL+"/templates/tpl/files/nothex", k1, nil, http.StatusBadRequest)
	do("GET", srv.URL+"/templates/tpl/files/"+testHash, "k2", nil, http.StatusNotFound) // another caller
	link := do("GET", srv.URL+"/templates/tpl/files/"+testHash, k1, nil, http.StatusOK)
	url := link["url"].(string)
	if link["present"] != false || !strings.HasPrefix(url, srv.URL+"/templates/tpl/files/"+testHash+"/upload?") {
		t.Fatalf("link: %v", link)
	}

	escape := do("PUT", url, "", mkTar(true, &tar.Header{Name: "a/../../x", Size: 1, Mode: 0o644, Typeflag: tar.TypeReg}), http.StatusBadRequest)
	if !strings.Contains(escape["message"].(string), "leaves the context") {
		t.Errorf("escape: %v", escape)
	}
	do("PUT", url, "", mkTar(false, &tar.Header{Name: "dev", Mode: 0o644, Typeflag: tar.TypeChar}), http.StatusBadRequest)
	do("PUT", strings.Replace(url, "signature=", "signature=0", 1), "", mkTar(false), http.StatusForbidden)
	expired := gw.uploadURL(httptest.NewRequest("GET", srv.URL, nil), ownerOf(k1), "tpl", testHash, time.Now().Add(-time.Second))
	do("PUT", strings.Replace(expired, "http://example.com", srv.URL, 1), "", mkTar(false), http.StatusForbidden)

	do("PUT", url, "", mkTar(true,
		&tar.Header{Name: "dir/", Mode: 0o755, Typeflag: tar.TypeDir},
		&tar.Header{Name: "dir/f", Size: 3, Mode: 0o644, Typeflag: tar.TypeReg},
		&tar.Header{Name: "link", Linkname: "/etc/passwd", Typeflag: tar.TypeSymlink},
	), http.StatusOK)
	if link := do("GET", srv.URL+"/templates/tpl/files/"+testHash, k1, nil, http.StatusOK); link["present"] != true {
		t.Fatalf("after the upload: %v", link)
	}
	// The context a build gets holds the upload, with nothing outside it.
	var ctx bytes.Buffer
	a, _ := gw.tpl.area(ownerOf(k1), "tpl")
	if err := writeTemplateContext(a.dir, []uploadRef{{hash: testHash}, {hash: testHash}}, &ctx); err != nil {
		t.Fatal(err)
	}
	bctx, err := build.ReadContext(&ctx, t.TempDir(), 1<<20, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer bctx.Close()
	var names []string
	for _, e := range bctx.Entries() {
		names = append(names, e.Name)
	}
	if strings.Join(names, ",") != "dir,dir/f,link" {
		t.Errorf("context entries %v", names)
	}
}

// FuzzPlanTemplate: whatever steps arrive, a translation is a Dockerfile of one instruction
// per line that Corral's parser reads, whose COPY sources stay inside the context.
func FuzzPlanTemplate(f *testing.F) {
	f.Add("RUN", "echo hi", "root", "")
	f.Add("COPY", "a/b", "/dest", "0644")
	f.Add("ENV", "A", `x"y\`, "")
	f.Add("WORKDIR", "/a b", "", "")
	f.Add("WORKDIR", `/a\`, "", "")
	f.Fuzz(func(t *testing.T, typ, a0, a1, a2 string) {
		args := []string{a0}
		if a1 != "" {
			args = append(args, a1)
		}
		if a2 != "" {
			args = append(args, a2)
		}
		st := templateStep{Type: typ, Args: args}
		if typ == "COPY" {
			st.FilesHash = testHash
		}
		p, err := planTemplate(templateStart{Steps: []templateStep{st, {Type: "RUN", Args: []string{"true"}}}}, "base:test", "")
		if err != nil {
			return
		}
		df, err := build.Parse(p.dockerfile)
		if err != nil {
			t.Fatalf("%q does not parse: %v", p.dockerfile, err)
		}
		if len(df.Instructions) != len(p.stepOf) {
			t.Fatalf("%q: %d instructions, %d steps", p.dockerfile, len(df.Instructions), len(p.stepOf))
		}
		if typ == "COPY" && (strings.HasPrefix(a0, "/") || strings.Contains("/"+a0+"/", "/../")) {
			t.Fatalf("COPY source %q accepted", a0)
		}
	})
}
