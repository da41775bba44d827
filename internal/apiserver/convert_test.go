package apiserver

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/build"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/lazy"
	"github.com/corral-dev/corral/internal/limits"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/report"
	"github.com/corral-dev/corral/internal/store"
	"github.com/corral-dev/corral/internal/webhook"
	corral "github.com/corral-dev/corral/sdk/go"
)

// fill sets every field under v to a value no other field has, so that a conversion that drops
// or swaps a field shows.
func fill(t *testing.T, v reflect.Value, n *int) {
	t.Helper()
	*n++
	switch {
	case v.Type() == reflect.TypeFor[time.Time]():
		v.Set(reflect.ValueOf(time.Unix(int64(*n), 0).UTC()))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprint("s", *n))
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Float64:
		v.SetFloat(float64(*n) + 0.5)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Uint8:
		v.SetUint(uint64(*n % 256))
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem(), n)
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(t, k, n)
		fill(t, e, n)
		v.SetMapIndex(k, e)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := range v.Len() {
			fill(t, v.Index(i), n)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			fill(t, v.Field(i), n)
		}
	default:
		t.Fatalf("fill: a field of kind %s: teach fill and the conversion about it", v.Kind())
	}
}

// leaves lists the values under v in field order, leaving out the top-level fields named skip.
func leaves(v reflect.Value, skip ...string) []any {
	if v.Type() == reflect.TypeFor[time.Time]() {
		return []any{v.Interface()}
	}
	switch v.Kind() {
	case reflect.Slice:
		var out []any
		for i := range v.Len() {
			out = append(out, leaves(v.Index(i))...)
		}
		return out
	case reflect.Pointer:
		if v.IsNil() {
			return []any{nil}
		}
		return leaves(v.Elem())
	case reflect.Map:
		keys := v.MapKeys()
		sort.Slice(keys, func(i, j int) bool { return fmt.Sprint(keys[i]) < fmt.Sprint(keys[j]) })
		var out []any
		for _, k := range keys {
			out = append(out, leaves(k)...)
			out = append(out, leaves(v.MapIndex(k))...)
		}
		return out
	case reflect.Struct:
		var out []any
		for i := range v.NumField() {
			if !slices.Contains(skip, v.Type().Field(i).Name) {
				out = append(out, leaves(v.Field(i))...)
			}
		}
		return out
	}
	return []any{v.Interface()}
}

// TestConversions: what an internal package hands the API reaches the wire whole, each value in
// its own field, and lazyd's control protocol stays the JSON of the API's FetchStats and
// ChunkCacheStats (the SDK's types, which lazyd spoke before it had its own: a daemon upgraded
// beside a running lazyd still reads it).
func TestConversions(t *testing.T) {
	n := 0
	var st lazy.Stats
	var cs lazy.CacheStats
	var rep report.Report
	fill(t, reflect.ValueOf(&st).Elem(), &n)
	fill(t, reflect.ValueOf(&cs).Elem(), &n)
	fill(t, reflect.ValueOf(&rep).Elem(), &n)
	for _, c := range []struct {
		name    string
		in, out any
		skip    []string // fields the conversion adds
	}{
		{"fetchStats", st, fetchStats(st), nil},
		{"chunkCacheStats", cs, chunkCacheStats(cs), nil},
		{"apiReport", rep, apiReport(rep, "p"), []string{"Project"}},
	} {
		got, want := leaves(reflect.ValueOf(c.out), c.skip...), leaves(reflect.ValueOf(c.in))
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: the API's fields hold %v, want %v (the internal type's, in order)", c.name, got, want)
		}
	}
	for _, c := range []struct {
		name        string
		lazyd, wire any
	}{
		{"Stats", st, fetchStats(st)},
		{"CacheStats", cs, chunkCacheStats(cs)},
	} {
		a, _ := json.Marshal(c.lazyd)
		b, _ := json.Marshal(c.wire)
		if string(a) != string(b) {
			t.Errorf("lazy.%s's JSON differs from the API's:\nlazyd %s\nAPI   %s", c.name, a, b)
		}
	}
	if got := apiReport(report.Report{}, "p"); got.Setup == nil || got.Project != "p" {
		t.Errorf("apiReport of an empty report = %+v, want Setup [] and Project p", got)
	}
}

// TestEventConversion: an event of the bus reaches the API whole, and its JSON (what the store
// keeps and webhooks deliver as their payload) is the API's LifecycleEvent's byte for byte,
// with every field set and with the omitempty ones empty; the bus's event types are the API's.
func TestEventConversion(t *testing.T) {
	n := 0
	var ev events.Event
	fill(t, reflect.ValueOf(&ev).Elem(), &n)
	if got, want := leaves(reflect.ValueOf(lifecycleEvent(ev))), leaves(reflect.ValueOf(ev)); !reflect.DeepEqual(got, want) {
		t.Errorf("lifecycleEvent: the API's fields hold %v, want %v (the bus's, in order)", got, want)
	}
	sameJSON(t, lifecycleEvent, ev, events.Event{ID: "e1", At: time.Unix(1, 5).UTC(), Type: events.Created}, events.Event{})
	if !slices.Equal(events.Types, model.EventTypes) {
		t.Errorf("events.Types = %v, want the API's %v", events.Types, model.EventTypes)
	}
	for _, c := range [][2]string{
		{events.Created, model.EventCreated}, {events.Started, model.EventStarted}, {events.Paused, model.EventPaused},
		{events.Resumed, model.EventResumed}, {events.Forked, model.EventForked}, {events.OOM, model.EventOOM},
		{events.TTLExpired, model.EventTTLExpired}, {events.IdleExpired, model.EventIdleExpired},
		{events.Deleted, model.EventDeleted}, {events.Failed, model.EventFailed},
		{events.EgressBlocked, model.EventEgressBlocked}, {events.QuotaRefused, model.EventQuotaRefused},
		{events.NodeState, model.EventNodeState},
	} {
		if c[0] != c[1] {
			t.Errorf("event type %q is %q in the API", c[0], c[1])
		}
	}
}

// TestWebhookDeliveryConversion: an entry of the delivery log reaches the API whole, and the JSON
// the store keeps is the API's WebhookDelivery's byte for byte (with every field set, and with
// the omitempty ones empty); deliveries are signed in the API's header.
func TestWebhookDeliveryConversion(t *testing.T) {
	n := 0
	var d store.WebhookDelivery
	fill(t, reflect.ValueOf(&d).Elem(), &n)
	if got, want := leaves(reflect.ValueOf(webhookDelivery(d))), leaves(reflect.ValueOf(d)); !reflect.DeepEqual(got, want) {
		t.Errorf("webhookDelivery: the API's fields hold %v, want %v (the store's, in order)", got, want)
	}
	sameJSON(t, webhookDelivery, d, store.WebhookDelivery{Webhook: "wh-1", Event: "e1", Type: events.Created, Attempt: 1,
		At: time.Unix(1, 5).UTC(), Result: "ok"}, store.WebhookDelivery{})
	if webhook.SignatureHeader != model.SignatureHeader {
		t.Errorf("webhook.SignatureHeader = %q, want the API's %q", webhook.SignatureHeader, model.SignatureHeader)
	}
}

// TestIAMNames: the authorisation model's names are the API's: permissions (in the SDK's order),
// roles (weakest first), principal kinds and the root project's path; and a quota refusal
// reaches the error body whole, its detail's JSON the API's QuotaExceeded's byte for byte.
func TestIAMNames(t *testing.T) {
	perms := []string{
		model.PermSandboxRead, model.PermSandboxCreate, model.PermSandboxUse, model.PermSandboxAdmin,
		model.PermLayerRead, model.PermLayerPublish, model.PermProjectRead, model.PermProjectCreate,
		model.PermProjectGrant, model.PermQuotaDelegate, model.PermAuditRead, model.PermOperator,
	}
	if got := iam.All.Names(); !slices.Equal(got, perms) {
		t.Errorf("iam's permissions are %q, want the API's %q", got, perms)
	}
	if p, err := iam.ParsePerms(perms); err != nil || p != iam.All {
		t.Errorf("iam.ParsePerms(the API's permissions) = %v, %v; want all", p, err)
	}
	if want := []string{model.RoleViewer, model.RoleUser, model.RoleAdmin, model.RoleOwner}; !slices.Equal(iam.Roles, want) {
		t.Errorf("iam.Roles = %q, want the API's %q", iam.Roles, want)
	}
	for _, c := range [][2]string{
		{iam.KindUser, model.KindUser}, {iam.KindService, model.KindService}, {iam.KindAgent, model.KindAgent},
		{iam.RootProject, model.RootProject}, {iam.Display(""), model.RootProject},
	} {
		if c[0] != c[1] {
			t.Errorf("iam's %q is %q in the API", c[0], c[1])
		}
	}
	for _, kind := range []string{model.KindUser, model.KindService, model.KindAgent} {
		if err := iam.CheckKind(kind); err != nil {
			t.Errorf("iam.CheckKind(%q): %v", kind, err)
		}
	}

	n := 0
	var q iam.QuotaExceeded
	fill(t, reflect.ValueOf(&q).Elem(), &n)
	api := model.QuotaExceeded(q)
	if got, want := leaves(reflect.ValueOf(api)), leaves(reflect.ValueOf(q)); !reflect.DeepEqual(got, want) {
		t.Errorf("QuotaExceeded: the API's fields hold %v, want %v (iam's, in order)", got, want)
	}
	if a, b := q.String(), (*corral.QuotaExceeded)(&api).String(); a != b {
		t.Errorf("iam.QuotaExceeded reads %q, the SDK's %q", a, b)
	}
	a, _ := json.Marshal(q)
	b, _ := json.Marshal(api)
	if string(a) != string(b) {
		t.Errorf("iam.QuotaExceeded's JSON differs from the API's:\niam %s\nAPI %s", a, b)
	}
	rec := httptest.NewRecorder()
	err := fmt.Errorf("create: %w", &iam.QuotaError{QuotaExceeded: q})
	httpjson.Error(rec, httptest.NewRequest(http.MethodPost, "/v1/sandboxes", nil), slog.New(slog.DiscardHandler), err)
	var body model.Error
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != http.StatusTooManyRequests || body.Quota == nil || *body.Quota != api {
		t.Errorf("a quota refusal answers %d %s (%v), want 429 with quota %+v", rec.Code, rec.Body, err, api)
	}
}

// TestLimitsConversion: the limits policy's Limits are the API's (a type with the API's fields
// and tags: the edge and the cluster server convert with a plain conversion), every field in its
// place, and the JSON the same byte for byte, set and empty.
func TestLimitsConversion(t *testing.T) {
	n := 0
	var l limits.Limits
	fill(t, reflect.ValueOf(&l).Elem(), &n)
	if got, want := leaves(reflect.ValueOf(model.Limits(l))), leaves(reflect.ValueOf(l)); !reflect.DeepEqual(got, want) {
		t.Errorf("Limits: the API's fields hold %v, want %v (the policy's, in order)", got, want)
	}
	conv := func(l limits.Limits) model.Limits { return model.Limits(l) }
	def, _ := limits.Default().Bounds(limits.TierMicroVM)
	sameJSON(t, conv, l, def.Default, def.Min, def.Max, limits.Limits{MemoryBytes: 1 << 30}, limits.Limits{})
}

// TestInfoConversion: what the daemon fills for GET /v1/info (Info) is the API's Info, every
// field in its place, and the JSON the same byte for byte, set and empty.
func TestInfoConversion(t *testing.T) {
	n := 0
	var info Info
	fill(t, reflect.ValueOf(&info).Elem(), &n)
	if got, want := leaves(reflect.ValueOf(model.Info(info))), leaves(reflect.ValueOf(info)); !reflect.DeepEqual(got, want) {
		t.Errorf("Info: the API's fields hold %v, want %v (the daemon's, in order)", got, want)
	}
	sameJSON(t, func(i Info) model.Info { return model.Info(i) }, info,
		Info{Version: "v1", Node: "local", Runtime: "runc", Runtimes: []string{"runc"}, DataDir: "/var/lib/corral", CgroupVersion: "2"}, Info{})
}

// TestNetworkConversion: the egress policy's Policy and Service are the API's NetworkPolicy and
// NetworkService (the edge converts them where a record or an answer takes them), every field in
// its place and the JSON the same byte for byte, set and empty: sandbox records keep the
// policy's. The modes are the API's.
func TestNetworkConversion(t *testing.T) {
	n := 0
	var p netpolicy.Policy
	var s netpolicy.Service
	fill(t, reflect.ValueOf(&p).Elem(), &n)
	fill(t, reflect.ValueOf(&s).Elem(), &n)
	if got, want := leaves(reflect.ValueOf(model.NetworkPolicy(p))), leaves(reflect.ValueOf(p)); !reflect.DeepEqual(got, want) {
		t.Errorf("Policy: the API's fields hold %v, want %v (netpolicy's, in order)", got, want)
	}
	if got, want := leaves(reflect.ValueOf(model.NetworkService(s))), leaves(reflect.ValueOf(s)); !reflect.DeepEqual(got, want) {
		t.Errorf("Service: the API's fields hold %v, want %v (netpolicy's, in order)", got, want)
	}
	sameJSON(t, func(p netpolicy.Policy) model.NetworkPolicy { return model.NetworkPolicy(p) },
		p, netpolicy.Policy{Mode: netpolicy.ModeOpen, Deny: []string{"203.0.113.7"}}, netpolicy.Policy{})
	sameJSON(t, func(s netpolicy.Service) model.NetworkService { return model.NetworkService(s) },
		s, netpolicy.Service{Name: "pypi"}, netpolicy.Service{})
	for _, c := range [][2]string{
		{netpolicy.ModeNone, model.NetworkNone}, {netpolicy.ModeAllowlist, model.NetworkAllowlist}, {netpolicy.ModeOpen, model.NetworkOpen},
	} {
		if c[0] != c[1] {
			t.Errorf("network mode %q is %q in the API", c[0], c[1])
		}
	}
}

// TestBuildConversion: a build request reaches internal/build whole, and a build's state and
// log reach the API whole, every field in its place and the JSON the same byte for byte (set,
// and with the omitempty ones empty); the states are the API's.
func TestBuildConversion(t *testing.T) {
	n := 0
	var req model.BuildRequest
	var b build.Build
	var ev build.Event
	fill(t, reflect.ValueOf(&req).Elem(), &n)
	fill(t, reflect.ValueOf(&b).Elem(), &n)
	fill(t, reflect.ValueOf(&ev).Elem(), &n)
	for _, c := range []struct {
		name    string
		in, out any
	}{
		{"buildSpec", req, buildSpec(req)},
		{"apiBuild", b, apiBuild(b)},
		{"apiBuildEvent", ev, apiBuildEvent(ev)},
	} {
		if got, want := leaves(reflect.ValueOf(c.out)), leaves(reflect.ValueOf(c.in)); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: the fields hold %v, want %v (in order)", c.name, got, want)
		}
	}
	sameJSON(t, buildSpec, req, model.BuildRequest{Name: "env", Dockerfile: "FROM base:1\n"}, model.BuildRequest{})
	at := time.Unix(1, 5).UTC()
	sameJSON(t, apiBuild, b, build.Build{ID: "b1", State: build.Running, Steps: []build.StepStatus{{N: 1, Text: "RUN x", Kind: build.StepRun, State: "pending"}}},
		build.Build{FinishedAt: &at}, build.Build{})
	sameJSON(t, apiBuildEvent, ev, build.Event{Type: "end", Build: &build.Build{ID: "b1", State: build.Failed}}, build.Event{Type: "log", Data: []byte("x")}, build.Event{})
	for _, c := range [][2]string{
		{build.Running, model.BuildRunning}, {build.Succeeded, model.BuildSucceeded}, {build.Failed, model.BuildFailed},
	} {
		if c[0] != c[1] {
			t.Errorf("build state %q is %q in the API", c[0], c[1])
		}
	}
}

// sameJSON checks, for each internal value, that its JSON is its API conversion's byte for byte
// and that the API's JSON reads back as the same value (so a value's slices are nil or hold
// something: omitempty reads an empty one back as nil).
func sameJSON[In, Out any](t *testing.T, conv func(In) Out, values ...In) {
	t.Helper()
	for _, v := range values {
		a, _ := json.Marshal(v)
		b, _ := json.Marshal(conv(v))
		if string(a) != string(b) {
			t.Errorf("%T's JSON differs from the API's %T:\ninternal %s\nAPI      %s", v, conv(v), a, b)
		}
		var back In
		if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, v) {
			t.Errorf("the API's JSON %s reads back as %+v (%v), want %+v", b, back, err, v)
		}
	}
}
