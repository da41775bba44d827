package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/iam"
	corral "github.com/corral-dev/corral/sdk/go"
	"github.com/corral-dev/corral/sdk/go/corraltest"
)

func TestCreate(t *testing.T) {
	h := newHarness(t)

	// The observed body of Sandbox.create('base', {timeoutMs, metadata, envs, network,
	// allowInternetAccess: false}) — without the lifecycle Corral refuses.
	sb := h.create(`{"templateID":"base","metadata":{"k":"v","team/name":"ml"},"envVars":{"B":"2","A":"1"},"timeout":120,` +
		`"allow_internet_access":false,"network":{"allowOut":["1.1.1.1"],"denyOut":["0.0.0.0/0"]},"autoResume":{"enabled":true}}`)
	if !strings.HasPrefix(sb.SandboxID, "sb-") || sb.TemplateID != "base" || sb.EnvdVersion != DefaultEnvdVersion ||
		sb.Domain != "e2b.test" || sb.ClientID == "" || sb.TrafficAccessToken != nil {
		t.Errorf("answer = %+v", sb)
	}
	if sb.EnvdAccessToken == "" || sb.EnvdAccessToken != h.gw.EnvdAccessToken(sb.SandboxID) || !h.gw.CheckEnvdAccessToken(sb.SandboxID, sb.EnvdAccessToken) {
		t.Errorf("envdAccessToken = %q, want the sandbox's derived token", sb.EnvdAccessToken)
	}
	got := h.lastCreate()
	want := corral.CreateRequest{
		Base:    "base:default",
		Env:     []string{"A=1", "B=2"},
		Labels:  map[string]string{"k": "v", "team/name": "ml", templateLabel: "base"},
		TTL:     "2m0s",
		Network: &corral.NetworkPolicy{Mode: corral.NetworkAllowlist, Allow: []string{"1.1.1.1"}},
	}
	gotNet, wantNet := *got.Network, *want.Network
	got.Network, want.Network = nil, nil
	if fmt.Sprint(got) != fmt.Sprint(want) || fmt.Sprint(gotNet) != fmt.Sprint(wantNet) {
		t.Errorf("Corral got\n %+v %+v\nwant\n %+v %+v", got, gotNet, want, wantNet)
	}
	if v, _ := h.fake.Sandbox(sb.SandboxID); v.Labels["k"] != "v" || !slices.Equal(v.Env, []string{"A=1", "B=2"}) {
		t.Errorf("Corral's sandbox = %+v", v)
	}

	t.Run("defaults", func(t *testing.T) {
		// What Sandbox.create() sends: the template only. E2B's defaults: 300 s, internet on.
		h.create(`{"templateID":"base"}`)
		got := h.lastCreate()
		if got.TTL != "5m0s" || got.Network == nil || got.Network.Mode != corral.NetworkOpen || got.Env != nil {
			t.Errorf("Corral got %+v (network %+v)", got, got.Network)
		}
	})
	t.Run("v1 defaults", func(t *testing.T) {
		// Older SDKs: POST /sandboxes with secure and allow_internet_access; the v1 default TTL is 15 s.
		resp := h.do("POST", "/sandboxes", `{"templateID":"base","secure":true,"allow_internet_access":true}`)
		if resp.status != http.StatusCreated {
			t.Fatalf("v1 create: %d %s", resp.status, resp.body)
		}
		if got := h.lastCreate(); got.TTL != "15s" || got.Network.Mode != corral.NetworkOpen {
			t.Errorf("Corral got %+v", got)
		}
	})
	t.Run("environment", func(t *testing.T) {
		h.front.envs["py"] = corral.Environment{Name: "py", Base: "base:default"}
		sb := h.create(`{"templateID":"py"}`)
		if got := h.lastCreate(); got.Environment != "py" || got.Base != "" {
			t.Errorf("Corral got %+v, want environment py", got)
		}
		if sb.TemplateID != "py" {
			t.Errorf("templateID = %q", sb.TemplateID)
		}
	})
	t.Run("environment called base", func(t *testing.T) {
		h.front.envs["base"] = corral.Environment{Name: "base", Base: "base:default"}
		defer delete(h.front.envs, "base")
		h.create(`{"templateID":"base"}`)
		if got := h.lastCreate(); got.Environment != "base" || got.Base != "" {
			t.Errorf("Corral got %+v, want environment base", got)
		}
	})
	t.Run("layer", func(t *testing.T) {
		h.fake.AddLayer("py", "3.12", corral.KindBase)
		h.create(`{"templateID":"py:3.12"}`)
		if got := h.lastCreate(); got.Base != "py:3.12" || got.Environment != "" {
			t.Errorf("Corral got %+v, want base py:3.12", got)
		}
	})
	// An unknown environment is the gateway's own 404; an unpublished layer is Corral's refusal
	// of the create's base, 400 (as the real server answers: a missing layer named in a body is
	// invalid input; the fake answered 404 until the conformance suite caught it).
	for _, tc := range []struct {
		tpl    string
		status int
	}{{"nope", http.StatusNotFound}, {"nope:1", http.StatusBadRequest}} {
		t.Run("unknown template "+tc.tpl, func(t *testing.T) {
			resp := h.do("POST", "/v2/sandboxes", `{"templateID":"`+tc.tpl+`"}`)
			code, msg := resp.errBody(t)
			if resp.status != tc.status || code != tc.status || !strings.Contains(msg, `"`+tc.tpl+`"`) {
				t.Errorf("got %d %d %q, want %d naming the template", resp.status, code, msg, tc.status)
			}
		})
	}
	t.Run("Corral refusal names the E2B field", func(t *testing.T) {
		// corraltest refuses a TTL that is no duration; Corral's own bounds read the same way.
		resp := h.do("POST", "/v2/sandboxes", `{"templateID":"base","envVars":{"A":"1"},"timeout":1}`)
		if resp.status != http.StatusCreated {
			t.Fatalf("%d %s", resp.status, resp.body)
		}
		err := createError(&corral.APIError{Status: 400, Code: corral.CodeInvalid, Field: "ttl", Message: "ttl: 900h exceeds the maximum 168h"}, "base", false)
		if e, ok := err.(*apiError); !ok || e.status != 400 || e.msg != "timeout: 900h exceeds the maximum 168h" {
			t.Errorf("createError = %v", err)
		}
		err = createError(&corral.APIError{Status: 400, Code: corral.CodeInvalid, Field: "network", Message: "network: sandbox networking is off"}, "base", false)
		if e, ok := err.(*apiError); !ok || !strings.HasPrefix(e.msg, "allow_internet_access:") || !strings.Contains(e.msg, "allowInternetAccess: false") {
			t.Errorf("createError = %v", err)
		}
		err = createError(&corral.APIError{Status: 400, Code: corral.CodeInvalid, Field: "network.allow[0]", Message: `network.allow[0]: "10.0.0.1" would open`}, "base", true)
		if e, ok := err.(*apiError); !ok || !strings.HasPrefix(e.msg, "network.allowOut[0]: ") {
			t.Errorf("createError = %v", err)
		}
	})
}

func TestCreateRefusals(t *testing.T) {
	h := newHarness(t)
	tests := []struct {
		name, body, field string
	}{
		{"no template", `{}`, "templateID"},
		{"autoPause", `{"templateID":"base","autoPause":true}`, "autoPause"},
		{"autoPauseMemory", `{"templateID":"base","autoPause":false,"autoPauseMemory":true}`, "autoPauseMemory"},
		{"autoResume off", `{"templateID":"base","autoResume":{"enabled":false}}`, "autoResume.enabled"},
		{"mcp", `{"templateID":"base","mcp":{"servers":{}}}`, "mcp"},
		{"iam", `{"templateID":"base","iam":{"tokens":{"a":{"audience":"x","tokenType":"jwt"}}}}`, "iam"},
		{"volumes", `{"templateID":"base","volumeMounts":[{"name":"v","path":"/data"}]}`, "volumeMounts"},
		{"private ports", `{"templateID":"base","network":{"allowPublicTraffic":false}}`, "network.allowPublicTraffic"},
		{"host mask", `{"templateID":"base","network":{"maskRequestHost":"localhost:${PORT}"}}`, "network.maskRequestHost"},
		{"https ports", `{"templateID":"base","network":{"httpsPorts":[443]}}`, "network.httpsPorts"},
		{"rules", `{"templateID":"base","network":{"rules":{"api.x.com":[{"transform":{"headers":{"a":"b"}}}]}}}`, "network.rules"},
		{"egress proxy", `{"templateID":"base","network":{"egressProxy":{"address":"p:3128"}}}`, "network.egressProxy"},
		{"domain excepted from a deny range", `{"templateID":"base","network":{"allowOut":["example.com"],"denyOut":["93.0.0.0/8"]}}`, "network.allowOut"},
		{"metadata key", `{"templateID":"base","metadata":{"has space":"v"}}`, "metadata"},
		{"metadata reserved key", `{"templateID":"base","metadata":{"corral-e2b/template":"x"}}`, "metadata"},
		{"metadata value", `{"templateID":"base","metadata":{"k":"a\nb"}}`, "metadata.k"},
		{"env name", `{"templateID":"base","envVars":{"1A":"x"}}`, "envVars"},
		{"timeout zero", `{"templateID":"base","timeout":0}`, "timeout"},
		{"timeout type", `{"templateID":"base","timeout":"60s"}`, "timeout"},
		{"unknown field", `{"templateID":"base","gpu":true}`, "gpu"},
		{"trailing data", `{"templateID":"base"} {}`, "request body"},
		{"not JSON", `templateID=base`, "request body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := h.createCount()
			resp := h.do("POST", "/v2/sandboxes", tt.body)
			code, msg := resp.errBody(t)
			if resp.status != http.StatusBadRequest || code != 400 || !strings.HasPrefix(msg, tt.field) {
				t.Errorf("got %d %d %q, want 400 starting with %q", resp.status, code, msg, tt.field)
			}
			if h.createCount() != before {
				t.Errorf("Corral received a create")
			}
		})
	}
	t.Run("too many metadata entries", func(t *testing.T) {
		var kv []string
		for i := range maxMetadata + 1 {
			kv = append(kv, fmt.Sprintf(`"k%d":"v"`, i))
		}
		resp := h.do("POST", "/v2/sandboxes", `{"templateID":"base","metadata":{`+strings.Join(kv, ",")+`}}`)
		if _, msg := resp.errBody(t); resp.status != 400 || !strings.HasPrefix(msg, "metadata: at most 63") {
			t.Errorf("got %d %q", resp.status, msg)
		}
	})
	t.Run("null and empty optional fields", func(t *testing.T) {
		h.create(`{"templateID":"base","mcp":null,"volumeMounts":[],"autoPause":false,"secure":false,"network":{}}`)
	})
}

// sdkMetadata encodes a metadata filter as the SDK does (docs/e2b-protocol.md §3.4): each key and
// value escaped, joined as a query string that is escaped again, then sent as one parameter.
func sdkMetadata(md map[string]string) string {
	inner := url.Values{}
	for k, v := range md {
		inner.Set(jsEscape(k), jsEscape(v))
	}
	return url.Values{"metadata": {inner.Encode()}}.Encode()
}

// jsEscape is encodeURIComponent for the characters the tests use.
func jsEscape(s string) string { return strings.ReplaceAll(url.QueryEscape(s), "+", "%20") }

func TestParseMetadataQuery(t *testing.T) {
	// The exact query the SDK sent for {k: 'v w'}.
	q, err := url.ParseQuery("metadata=k%3Dv%252520w&state=running,paused&limit=10")
	if err != nil {
		t.Fatal(err)
	}
	got, err := parseMetadataQuery(q.Get("metadata"))
	if err != nil || len(got) != 1 || got["k"] != "v w" {
		t.Errorf("parse = %v, %v; want k = \"v w\"", got, err)
	}
	want := map[string]string{"a&b": "c=d", "user": "x y%z", "plain": "1"}
	q, _ = url.ParseQuery(sdkMetadata(want))
	got, err = parseMetadataQuery(q.Get("metadata"))
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("round trip = %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"=v", "k=%zz", "%"} {
		if _, err := parseMetadataQuery(bad); err == nil {
			t.Errorf("parse %q: no error", bad)
		}
	}
}

func FuzzParseMetadataQuery(f *testing.F) {
	f.Add("k%3Dv%252520w")
	f.Add("a=b&c=d")
	f.Add("%")
	f.Fuzz(func(t *testing.T, s string) {
		md, err := parseMetadataQuery(s)
		if err == nil {
			for k := range md {
				if k == "" {
					t.Errorf("empty key from %q", s)
				}
			}
		}
	})
}

func TestList(t *testing.T) {
	h := newHarness(t)
	var ids []string
	for i, team := range []string{"a", "a", "b", "a"} {
		sb := h.create(fmt.Sprintf(`{"templateID":"base","metadata":{"team":%q,"n":"%d","who":"x y"}}`, team, i))
		ids = append(ids, sb.SandboxID) // equal start times (the fake's clock counts ms) fall back to ID order: sb-1 < sb-2 ...
	}
	h.do("DELETE", "/sandboxes/"+ids[3], "") // ended: never listed
	if resp := h.do("POST", "/sandboxes/"+ids[1]+"/pause", "{}"); resp.status != http.StatusNoContent {
		t.Fatalf("pause: %d %s", resp.status, resp.body)
	}

	list := func(query string) ([]sandboxDetail, response) {
		t.Helper()
		resp := h.do("GET", "/v2/sandboxes?"+query, "")
		if resp.status != http.StatusOK {
			t.Fatalf("list ?%s: %d %s", query, resp.status, resp.body)
		}
		var out []sandboxDetail
		resp.decode(t, &out)
		return out, resp
	}
	idsOf := func(l []sandboxDetail) []string {
		var out []string
		for _, s := range l {
			out = append(out, s.SandboxID)
		}
		return out
	}

	got, resp := list(sdkMetadata(map[string]string{"team": "a", "who": "x y"}))
	if want := []string{ids[1], ids[0]}; !slices.Equal(idsOf(got), want) {
		t.Errorf("metadata team=a: %v, want %v (newest first, ended ones left out)", idsOf(got), want)
	}
	if resp.header.Get("X-Total-Running") != "1" || resp.header.Get("X-Next-Token") != "" {
		t.Errorf("headers: %v", resp.header)
	}
	if got[0].State != "paused" || got[1].State != "running" || got[1].Metadata["team"] != "a" || got[1].Metadata[templateLabel] != "" ||
		got[1].TemplateID != "base" || got[1].StartedAt.IsZero() || got[1].EndAt.IsZero() || got[1].EnvdVersion != DefaultEnvdVersion {
		t.Errorf("items: %+v", got)
	}
	if got, _ := list(sdkMetadata(map[string]string{"team": "a"}) + "&state=running"); !slices.Equal(idsOf(got), []string{ids[0]}) {
		t.Errorf("state=running: %v", idsOf(got))
	}
	if got, _ := list("state=paused"); !slices.Equal(idsOf(got), []string{ids[1]}) {
		t.Errorf("state=paused: %v", idsOf(got))
	}

	// Pages of one, oldest first, following X-Next-Token to the end.
	var seen []string
	query := "order=asc&limit=1"
	for range 5 {
		page, resp := list(query)
		seen = append(seen, idsOf(page)...)
		next := resp.header.Get("X-Next-Token")
		if next == "" {
			break
		}
		query = "order=asc&limit=1&nextToken=" + url.QueryEscape(next)
	}
	if want := ids[:3]; !slices.Equal(seen, want) {
		t.Errorf("pages: %v, want %v", seen, want)
	}
	if got, _ := list("startedAfter=" + url.QueryEscape(time.Now().Add(time.Hour).Format(time.RFC3339))); len(got) != 0 {
		t.Errorf("startedAfter the future: %v", idsOf(got))
	}
	if got, _ := list("template=other"); len(got) != 0 {
		t.Errorf("template=other: %v", idsOf(got))
	}

	// v1: running only, one answer.
	resp = h.do("GET", "/sandboxes?"+sdkMetadata(map[string]string{"team": "a"}), "")
	var v1 []sandboxDetail
	resp.decode(t, &v1)
	if !slices.Equal(idsOf(v1), []string{ids[0]}) {
		t.Errorf("v1 list: %v", idsOf(v1))
	}

	for _, bad := range []string{"state=stopped", "limit=0", "limit=101", "order=up", "nextToken=zz", "startedAfter=yesterday", "page=2"} {
		resp := h.do("GET", "/v2/sandboxes?"+bad, "")
		if code, _ := resp.errBody(t); resp.status != 400 || code != 400 {
			t.Errorf("?%s: %d %s, want 400", bad, resp.status, resp.body)
		}
	}
}

func TestGetAndKill(t *testing.T) {
	h := newHarness(t)
	sb := h.create(`{"templateID":"base","metadata":{"k":"v"},"network":{"denyOut":["1.2.3.4"]}}`)

	resp := h.do("GET", "/sandboxes/"+sb.SandboxID, "")
	var d sandboxDetail
	resp.decode(t, &d)
	if resp.status != 200 || d.SandboxID != sb.SandboxID || d.State != "running" || d.Metadata["k"] != "v" || d.Domain != "e2b.test" ||
		d.Lifecycle == nil || d.Lifecycle.OnTimeout != "kill" || d.AllowInternetAccess == nil || !*d.AllowInternetAccess ||
		d.Network == nil || !slices.Equal(d.Network.DenyOut, []string{"1.2.3.4"}) || d.CPUCount < 0 {
		t.Errorf("get: %d %s", resp.status, resp.body)
	}
	if strings.Contains(string(resp.body), "envdAccessToken") {
		t.Errorf("getInfo hands out the envd access token: %s", resp.body)
	}

	if resp := h.do("DELETE", "/sandboxes/"+sb.SandboxID, ""); resp.status != http.StatusNoContent {
		t.Fatalf("kill: %d %s", resp.status, resp.body)
	}
	if v, _ := h.fake.Sandbox(sb.SandboxID); v.State != corral.StateStopped {
		t.Errorf("Corral's sandbox is %s after kill", v.State)
	}
	// The SDK's kill returns false on a body code of 404; getInfo throws SandboxNotFoundError.
	for _, tc := range []struct{ method, path string }{
		{"DELETE", "/sandboxes/" + sb.SandboxID},
		{"GET", "/sandboxes/" + sb.SandboxID},
		{"DELETE", "/sandboxes/sb-nope"},
		{"GET", "/sandboxes/sb-nope"},
		{"POST", "/sandboxes/sb-nope/timeout"},
		{"POST", "/sandboxes/sb-nope/pause"},
		{"POST", "/v2/sandboxes/sb-nope/connect"},
		{"POST", "/sandboxes/" + sb.SandboxID + "/pause"},
		{"POST", "/sandboxes/" + sb.SandboxID + "/timeout"},
		{"GET", "/sandboxes/sb-nope/metrics"},
		{"GET", "/v2/sandboxes/sb-nope/logs"},
		{"PUT", "/sandboxes/sb-nope/network"},
	} {
		body := ""
		if tc.method != "GET" && tc.method != "DELETE" {
			body = `{"timeout":30}`
			if strings.HasSuffix(tc.path, "network") || strings.HasSuffix(tc.path, "pause") {
				body = `{}`
			}
		}
		resp := h.do(tc.method, tc.path, body)
		if code, msg := resp.errBody(t); resp.status != http.StatusNotFound || code != 404 || !strings.Contains(msg, "not found") {
			t.Errorf("%s %s: %d %s, want 404 with code 404", tc.method, tc.path, resp.status, resp.body)
		}
	}
}

func TestSetTimeout(t *testing.T) {
	h := newHarness(t)
	sb := h.create(`{"templateID":"base","timeout":3600}`)
	before := time.Now()
	if resp := h.do("POST", "/sandboxes/"+sb.SandboxID+"/timeout", `{"timeout":60}`); resp.status != http.StatusNoContent {
		t.Fatalf("timeout: %d %s", resp.status, resp.body)
	}
	// setTimeout may shorten.
	v, _ := h.fake.Sandbox(sb.SandboxID)
	if left := v.ExpiresAt.Sub(before); left < 59*time.Second || left > 61*time.Second {
		t.Errorf("expires in %s, want 60s", left)
	}
	for _, body := range []string{`{}`, `{"timeout":-1}`, ``} {
		resp := h.do("POST", "/sandboxes/"+sb.SandboxID+"/timeout", body)
		if code, _ := resp.errBody(t); code != 400 {
			t.Errorf("body %q: %d %s, want 400", body, resp.status, resp.body)
		}
	}
	// refreshes only extend.
	if resp := h.do("POST", "/sandboxes/"+sb.SandboxID+"/refreshes", `{"duration":10}`); resp.status != http.StatusNoContent {
		t.Fatalf("refresh: %d %s", resp.status, resp.body)
	}
	if v2, _ := h.fake.Sandbox(sb.SandboxID); v2.ExpiresAt.Before(v.ExpiresAt) {
		t.Errorf("refresh shortened the life: %s -> %s", v.ExpiresAt, v2.ExpiresAt)
	}
	if resp := h.do("POST", "/sandboxes/"+sb.SandboxID+"/refreshes", `{"duration":600}`); resp.status != http.StatusNoContent {
		t.Fatalf("refresh: %d %s", resp.status, resp.body)
	}
	if v3, _ := h.fake.Sandbox(sb.SandboxID); v3.ExpiresAt.Sub(before) < 599*time.Second {
		t.Errorf("refresh of 600 s: expires in %s", v3.ExpiresAt.Sub(before))
	}
}

func TestPauseResumeConnect(t *testing.T) {
	h := newHarness(t)
	sb := h.create(`{"templateID":"base","timeout":60}`)
	id := sb.SandboxID
	state := func() string {
		t.Helper()
		var d sandboxDetail
		h.do("GET", "/sandboxes/"+id, "").decode(t, &d)
		return d.State
	}

	// Connect to a running sandbox: 200, its token, the TTL only extended.
	resp := h.do("POST", "/v2/sandboxes/"+id+"/connect", `{"timeout":600}`)
	var c sandboxJSON
	resp.decode(t, &c)
	if resp.status != http.StatusOK || c.SandboxID != id || c.EnvdAccessToken != sb.EnvdAccessToken || c.Domain != "e2b.test" {
		t.Errorf("connect to running: %d %s", resp.status, resp.body)
	}
	v, _ := h.fake.Sandbox(id)
	if left := time.Until(v.ExpiresAt); left < 590*time.Second {
		t.Errorf("connect with 600 s left %s", left)
	}
	if resp := h.do("POST", "/v2/sandboxes/"+id+"/connect", `{"timeout":5}`); resp.status != http.StatusOK {
		t.Fatalf("connect: %d %s", resp.status, resp.body)
	}
	if v2, _ := h.fake.Sandbox(id); v2.ExpiresAt.Before(v.ExpiresAt) {
		t.Errorf("connect shortened the life: %s -> %s", v.ExpiresAt, v2.ExpiresAt)
	}

	// Pause (the SDK's pause() sends {}; 2.20.0 sends no body), twice: 204, then 409 with code 409.
	if resp := h.do("POST", "/sandboxes/"+id+"/pause", ""); resp.status != http.StatusNoContent {
		t.Fatalf("pause: %d %s", resp.status, resp.body)
	}
	if state() != "paused" {
		t.Errorf("state after pause = %s", state())
	}
	resp = h.do("POST", "/sandboxes/"+id+"/pause", `{}`)
	if code, _ := resp.errBody(t); resp.status != http.StatusConflict || code != 409 {
		t.Errorf("second pause: %d %s, want 409 with code 409", resp.status, resp.body)
	}
	resp = h.do("POST", "/sandboxes/"+id+"/pause", `{"memory":false}`)
	if _, msg := resp.errBody(t); resp.status != 400 || !strings.HasPrefix(msg, "memory") {
		t.Errorf("pause without memory: %d %s", resp.status, resp.body)
	}

	// Connect resumes a paused sandbox: 201.
	resp = h.do("POST", "/v2/sandboxes/"+id+"/connect", `{"timeout":30}`)
	resp.decode(t, &c)
	if resp.status != http.StatusCreated || c.EnvdAccessToken != sb.EnvdAccessToken {
		t.Errorf("connect to paused: %d %s", resp.status, resp.body)
	}
	if state() != "running" {
		t.Errorf("state after connect = %s", state())
	}
	resp = h.do("POST", "/v2/sandboxes/"+id+"/connect", `{"memory":false}`)
	if _, msg := resp.errBody(t); resp.status != 400 || !strings.HasPrefix(msg, "memory") {
		t.Errorf("connect with reboot: %d %s", resp.status, resp.body)
	}

	// v1 connect needs a timeout; v1 resume needs a paused sandbox.
	if resp := h.do("POST", "/sandboxes/"+id+"/connect", `{}`); resp.status != 400 {
		t.Errorf("v1 connect without timeout: %d %s", resp.status, resp.body)
	}
	if resp := h.do("POST", "/sandboxes/"+id+"/connect", `{"timeout":30}`); resp.status != http.StatusOK {
		t.Errorf("v1 connect: %d %s", resp.status, resp.body)
	}
	resp = h.do("POST", "/sandboxes/"+id+"/resume", `{}`)
	if code, _ := resp.errBody(t); resp.status != http.StatusConflict || code != 409 {
		t.Errorf("resume of running: %d %s", resp.status, resp.body)
	}
	h.do("POST", "/sandboxes/"+id+"/pause", `{"memory":true}`)
	resp = h.do("POST", "/sandboxes/"+id+"/resume", `{"timeout":120,"autoPause":false}`)
	resp.decode(t, &c)
	if resp.status != http.StatusCreated || c.SandboxID != id || state() != "running" {
		t.Errorf("v1 resume: %d %s", resp.status, resp.body)
	}
	if v, _ := h.fake.Sandbox(id); time.Until(v.ExpiresAt) > 121*time.Second {
		t.Errorf("v1 resume set %s, want 120 s", time.Until(v.ExpiresAt))
	}
}

func TestAuth(t *testing.T) {
	h := newHarness(t)
	resp := h.doKey("", "GET", "/v2/sandboxes", "")
	if code, msg := resp.errBody(t); resp.status != http.StatusUnauthorized || code != 401 || !strings.Contains(msg, "X-API-Key") {
		t.Errorf("no key: %d %s", resp.status, resp.body)
	}
	// A wrong key is Corral's to refuse.
	resp = h.doKey("e2b_0123", "POST", "/v2/sandboxes", `{"templateID":"base"}`)
	if code, msg := resp.errBody(t); resp.status != http.StatusUnauthorized || code != 401 || !strings.HasPrefix(msg, "Corral refused the API key") {
		t.Errorf("wrong key: %d %s", resp.status, resp.body)
	}
	// The key reaches Corral as the bearer token (Authorization: Bearer works too).
	req, _ := http.NewRequest("GET", h.url+"/v2/sandboxes", nil)
	req.Header.Set("Authorization", "Bearer "+h.fake.Token)
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != 200 {
		t.Errorf("bearer: %d", r.StatusCode)
	}
	found := false
	for _, rec := range h.fake.Requests() {
		if rec.Path == "/v1/sandboxes" && rec.Header.Get("Authorization") == "Bearer "+h.fake.Token &&
			strings.HasPrefix(rec.Header.Get("User-Agent"), "corral-e2b-gateway") {
			found = true
		}
	}
	if !found {
		t.Errorf("Corral never saw the key as its bearer token: %v", h.fake.RequestLines())
	}

	// Corral's authorisation decides: a viewer may list but not create.
	tok, err := h.fake.Client().CreateToken(context.Background(), corral.TokenRequest{Project: "/", Role: "viewer"})
	if err != nil {
		t.Fatal(err)
	}
	if resp := h.doKey(tok.Token, "GET", "/v2/sandboxes", ""); resp.status != 200 {
		t.Errorf("viewer list: %d %s", resp.status, resp.body)
	}
	resp = h.doKey(tok.Token, "POST", "/v2/sandboxes", `{"templateID":"base:default"}`)
	if code, msg := resp.errBody(t); resp.status != http.StatusForbidden || code != 403 || msg == "" {
		t.Errorf("viewer create: %d %s", resp.status, resp.body)
	}
}

// TestE2BKeyAlias: a token's E2B alias (e2b_ and hex, the only shape E2B's Python SDK accepts)
// works as the API key, and reaches Corral as the token it stands for.
func TestE2BKeyAlias(t *testing.T) {
	secret, _ := iam.NewToken()
	key, err := iam.E2BKey(secret)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^e2b_[0-9a-f]+$`).MatchString(key) {
		t.Fatalf("alias %q does not have E2B's key shape", key)
	}
	h := newHarnessToken(t, secret)
	if resp := h.doKey(key, "GET", "/v2/sandboxes", ""); resp.status != http.StatusOK {
		t.Fatalf("list with the alias: %d %s", resp.status, resp.body)
	}
	resp := h.doKey(key, "POST", "/v2/sandboxes", `{"templateID":"base:default"}`)
	if resp.status != http.StatusCreated {
		t.Fatalf("create with the alias: %d %s", resp.status, resp.body)
	}
	for _, rec := range h.fake.Requests() {
		if got := rec.Header.Get("Authorization"); got != "Bearer "+secret {
			t.Errorf("%s %s reached Corral with %q, want the token the alias stands for", rec.Method, rec.Path, got)
		}
	}
	// An alias of another token is not this one.
	other, _ := iam.NewToken()
	otherKey, _ := iam.E2BKey(other)
	if resp := h.doKey(otherKey, "GET", "/v2/sandboxes", ""); resp.status != http.StatusUnauthorized {
		t.Errorf("another token's alias: %d %s", resp.status, resp.body)
	}
}

func TestMetricsAndLogs(t *testing.T) {
	h := newHarness(t)
	sb := h.create(`{"templateID":"base"}`)
	resp := h.do("GET", "/sandboxes/"+sb.SandboxID+"/metrics?start=1&end=2", "")
	if resp.status != 200 || strings.TrimSpace(string(resp.body)) != "[]" {
		t.Errorf("metrics before any sample: %d %s", resp.status, resp.body)
	}
	// The node's samples, in E2B's shape: CPU as a share of the sandbox's CPUs.
	m0 := time.Now().Add(-10 * time.Second).UTC().Truncate(time.Second)
	if !h.front.fake.SetMetrics(sb.SandboxID, []corral.MetricSample{
		{At: m0, CPUPercent: 50, MemoryBytes: 1 << 20, DiskBytes: 4096},
		{At: m0.Add(5 * time.Second), CPUPercent: 100, MemoryBytes: 2 << 20, DiskBytes: 8192},
	}) {
		t.Fatal("SetMetrics: no such sandbox")
	}
	var ms []metric
	resp = h.do("GET", "/sandboxes/"+sb.SandboxID+"/metrics", "")
	if resp.status != 200 || json.Unmarshal(resp.body, &ms) != nil || len(ms) != 2 || ms[1].MemUsed != 2<<20 || ms[1].DiskUsed != 8192 ||
		ms[1].TimestampUnix != m0.Add(5*time.Second).Unix() || ms[0].CPUUsedPct <= 0 {
		t.Errorf("metrics: %d %s", resp.status, resp.body)
	}
	resp = h.do("GET", fmt.Sprintf("/sandboxes/%s/metrics?start=%d", sb.SandboxID, m0.Add(time.Second).Unix()), "")
	if resp.status != 200 || json.Unmarshal(resp.body, &ms) != nil || len(ms) != 1 {
		t.Errorf("metrics from start: %d %s", resp.status, resp.body)
	}
	resp = h.do("GET", "/sandboxes/"+sb.SandboxID+"/metrics?start=5&end=2", "")
	if resp.status != 400 {
		t.Errorf("metrics with end before start: %d %s", resp.status, resp.body)
	}
	resp = h.do("GET", "/sandboxes/metrics?sandbox_ids="+sb.SandboxID+",sb-nope", "")
	var many struct {
		Sandboxes map[string]metric `json:"sandboxes"`
	}
	if resp.status != 200 || json.Unmarshal(resp.body, &many) != nil || len(many.Sandboxes) != 1 || many.Sandboxes[sb.SandboxID].MemUsed != 2<<20 {
		t.Errorf("metrics of many: %d %s", resp.status, resp.body)
	}

	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h.front.trajectory[sb.SandboxID] = []corral.TrajectoryEntry{
		{Seq: 1, Kind: "exec", Request: map[string]any{"argv": []any{"ls", "/"}}, State: corral.StepDone, StartedAt: t0, Exit: &corral.Exit{Code: 0}},
		{Seq: 2, Kind: "write_file", StepID: "w1", Request: map[string]any{"path": "/root/a"}, State: corral.StepDone, StartedAt: t0.Add(time.Second)},
		{Seq: 3, Kind: "exec", Request: map[string]any{"argv": []any{"false"}}, State: corral.StepDone, StartedAt: t0.Add(2 * time.Second), Exit: &corral.Exit{Code: 1}},
	}
	var v2 struct {
		Logs []logEntry `json:"logs"`
	}
	h.do("GET", "/v2/sandboxes/"+sb.SandboxID+"/logs", "").decode(t, &v2)
	if len(v2.Logs) != 3 || v2.Logs[0].Message != "exec ls / (exit 0)" || v2.Logs[1].Message != "write_file /root/a" ||
		v2.Logs[1].Fields["step_id"] != "w1" || v2.Logs[2].Level != "warn" || !v2.Logs[0].Timestamp.Equal(t0) {
		t.Errorf("logs: %+v", v2.Logs)
	}
	h.do("GET", fmt.Sprintf("/v2/sandboxes/%s/logs?direction=backward&limit=1&level=warn", sb.SandboxID), "").decode(t, &v2)
	if len(v2.Logs) != 1 || v2.Logs[0].Fields["seq"] != "3" {
		t.Errorf("backward, warn, 1: %+v", v2.Logs)
	}
	h.do("GET", fmt.Sprintf("/v2/sandboxes/%s/logs?cursor=%d&search=exec", sb.SandboxID, t0.Add(time.Second).UnixMilli()), "").decode(t, &v2)
	if len(v2.Logs) != 1 || v2.Logs[0].Fields["seq"] != "3" {
		t.Errorf("cursor, search: %+v", v2.Logs)
	}
	var v1 struct {
		Logs       []logLine  `json:"logs"`
		LogEntries []logEntry `json:"logEntries"`
	}
	h.do("GET", "/sandboxes/"+sb.SandboxID+"/logs?limit=2", "").decode(t, &v1)
	if len(v1.Logs) != 2 || len(v1.LogEntries) != 2 || v1.Logs[1].Line != "write_file /root/a" {
		t.Errorf("v1 logs: %+v", v1)
	}
	if resp := h.do("GET", "/v2/sandboxes/"+sb.SandboxID+"/logs?level=loud", ""); resp.status != 400 {
		t.Errorf("level=loud: %d", resp.status)
	}
}

func TestUpdateNetwork(t *testing.T) {
	h := newHarness(t)
	sb := h.create(`{"templateID":"base"}`)
	resp := h.do("PUT", "/sandboxes/"+sb.SandboxID+"/network", `{"allowOut":["pypi.org"],"denyOut":["0.0.0.0/0"]}`)
	if resp.status != http.StatusNoContent {
		t.Fatalf("update: %d %s", resp.status, resp.body)
	}
	if p := h.front.network[sb.SandboxID]; p.Mode != corral.NetworkAllowlist || !slices.Equal(p.Allow, []string{"pypi.org"}) {
		t.Errorf("Corral got %+v", p)
	}
	var d sandboxDetail
	h.do("GET", "/sandboxes/"+sb.SandboxID, "").decode(t, &d)
	if *d.AllowInternetAccess || !slices.Equal(d.Network.AllowOut, []string{"pypi.org"}) || !slices.Equal(d.Network.DenyOut, []string{allTraffic}) {
		t.Errorf("detail network: %v %+v", *d.AllowInternetAccess, d.Network)
	}
	resp = h.do("PUT", "/sandboxes/"+sb.SandboxID+"/network", `{"egressProxy":{"address":"p:1"}}`)
	if _, msg := resp.errBody(t); resp.status != 400 || !strings.HasPrefix(msg, "network.egressProxy") {
		t.Errorf("egressProxy: %d %s", resp.status, resp.body)
	}
}

func TestUnsupportedRoutes(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{"POST", "/sandboxes/sb-1/snapshots", 501},
		{"GET", "/snapshots", 501},
		{"POST", "/templates/tags", 501},
		{"DELETE", "/templates/tags", 501},
		{"DELETE", "/templates/t", 404}, // an unknown template (templates.go maps the route)
		{"GET", "/teams", 404},
	} {
		resp := h.do(tc.method, tc.path, "")
		if code, _ := resp.errBody(t); resp.status != tc.status || code != tc.status {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, resp.status, resp.body, tc.status)
		}
	}
}

func TestConfig(t *testing.T) {
	good := Config{CorralURL: "http://127.0.0.1:7070", TokenKey: testKey}
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for name, mod := range map[string]func(*Config){
		"no URL":      func(c *Config) { c.CorralURL = "" },
		"bad scheme":  func(c *Config) { c.CorralURL = "ftp://x" },
		"short key":   func(c *Config) { c.TokenKey = []byte("k") },
		"old envd":    func(c *Config) { c.EnvdVersion = "0.0.9" },
		"bad envd":    func(c *Config) { c.EnvdVersion = "v1" },
		"bad domain":  func(c *Config) { c.Domain = "http://x/" },
		"short timer": func(c *Config) { c.DefaultTimeout = time.Millisecond },
	} {
		c := good
		mod(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	g, _ := New(good, nil)
	other, _ := New(Config{CorralURL: good.CorralURL, TokenKey: []byte(strings.Repeat("x", 32))}, nil)
	if g.EnvdAccessToken("sb-a") == g.EnvdAccessToken("sb-b") || g.EnvdAccessToken("sb-a") == other.EnvdAccessToken("sb-a") {
		t.Error("tokens do not depend on the sandbox and the key")
	}
	if g.CheckEnvdAccessToken("sb-a", g.EnvdAccessToken("sb-b")) || g.CheckEnvdAccessToken("sb-a", "") {
		t.Error("a wrong token passes")
	}
}

func TestDomainDefaultsToHost(t *testing.T) {
	h := newHarness(t)
	h.gw.cfg.Domain = ""
	sb := h.create(`{"templateID":"base"}`)
	if u, _ := url.Parse(h.url); sb.Domain != u.Host {
		t.Errorf("domain = %q, want the request's host %q", sb.Domain, u.Host)
	}
}

// TestFork: E2B's fork maps onto Corral's: count copies living timeout seconds, one entry per
// copy with its sandbox; a runc sandbox (no processes to fork) is a 409, an unknown one a 404.
func TestFork(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	src, err := h.fake.Client().CreateSandbox(ctx, corral.CreateRequest{Base: corraltest.DefaultBase, Runtime: "gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	resp := h.do("POST", "/sandboxes/"+src.ID+"/fork", `{"count":2,"timeout":60}`)
	if resp.status != http.StatusCreated {
		t.Fatalf("fork: %d %s", resp.status, resp.body)
	}
	var out []struct {
		Sandbox *sandboxJSON `json:"sandbox"`
		Error   any          `json:"error"`
	}
	resp.decode(t, &out)
	if len(out) != 2 {
		t.Fatalf("fork answered %d entries, want 2: %s", len(out), resp.body)
	}
	for _, e := range out {
		if e.Sandbox == nil || e.Error != nil || e.Sandbox.SandboxID == src.ID || e.Sandbox.EnvdAccessToken != h.gw.EnvdAccessToken(e.Sandbox.SandboxID) {
			t.Fatalf("entry %+v: want a new sandbox with its envd token", e)
		}
		v, _ := h.fake.Sandbox(e.Sandbox.SandboxID)
		if left := time.Until(v.ExpiresAt); v.ForkedFrom != src.ID || left < 50*time.Second || left > 61*time.Second {
			t.Errorf("copy %+v: want forked_from %s, expiring in about 60 s (%v)", v, src.ID, left)
		}
	}
	plain := h.create(`{"templateID":"base"}`)
	if resp := h.do("POST", "/sandboxes/"+plain.SandboxID+"/fork", `{}`); resp.status != http.StatusConflict {
		t.Errorf("fork of a runc sandbox: %d %s, want 409", resp.status, resp.body)
	}
	if resp := h.do("POST", "/sandboxes/sb-404/fork", `{}`); resp.status != http.StatusNotFound {
		t.Errorf("fork of an unknown sandbox: %d %s, want 404", resp.status, resp.body)
	}
	if resp := h.do("POST", "/sandboxes/"+src.ID+"/fork", `{"count":0}`); resp.status != http.StatusBadRequest {
		t.Errorf("fork of 0: %d %s, want 400", resp.status, resp.body)
	}
}
