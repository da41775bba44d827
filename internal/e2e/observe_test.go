package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/webhook"
	corral "github.com/corral-dev/corral/sdk/go"
)

// Observation end to end (issue 28): metrics of a busy sandbox rise; the event stream sees a
// sandbox's life in order, scoped to the token's projects; webhooks get signed deliveries,
// retried on 500 and given up on a receiver that hangs; the report's figures.

// TestObserveMetrics: a sandbox kept busy (a CPU loop, a file written, a second process) shows
// it in its samples, on every runtime; samples outlive the sandbox; reading them is validated.
func TestObserveMetrics(t *testing.T) {
	forRuntimes(t, func(t *testing.T, rt string) {
		p := withBaseOn(t, rt, "--sample-interval", "300ms")
		ctx := t.Context()
		sb := p.create(corral.CreateRequest{})
		if _, err := p.Client.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", "while :; do :; done"}}); err != nil {
			t.Fatal(err)
		}
		p.sh(sb.ID, "dd if=/dev/urandom of=/root/blob bs=1M count=24 2>/dev/null; sync")
		var last corral.MetricSample
		minCPU := 10.0 // idle: about 0
		if rt == "microvm" {
			minCPU = 5 // its QEMU under TCG on a shared host
		}
		eventually(t, 60*time.Second, "samples showing the busy loop, its memory, tasks and the file written", func() bool {
			m, err := p.Client.SandboxMetrics(ctx, sb.ID, time.Time{})
			if err != nil || len(m.Samples) == 0 {
				return false
			}
			last = m.Samples[len(m.Samples)-1]
			return last.CPUPercent > minCPU && last.MemoryBytes > 0 && last.MemoryPeakBytes >= last.MemoryBytes &&
				last.Pids >= 2 && (rt == "gvisor" || last.DiskBytes >= 20<<20)
		})
		t.Logf("%s: latest sample %+v", rt, last)
		// since keeps later samples only.
		m, err := p.Client.SandboxMetrics(ctx, sb.ID, last.At)
		if err != nil || len(m.Samples) > 2 {
			t.Errorf("samples since the latest: %d, %v", len(m.Samples), err)
		}
		out, errOut, code := p.cli("", "metrics", sb.ID, "-o", "json")
		var cm corral.Metrics
		if code != 0 || json.Unmarshal([]byte(out), &cm) != nil || len(cm.Samples) == 0 || cm.IntervalSeconds != 0.3 {
			t.Errorf("corral metrics -o json: %d %s %s", code, out, errOut)
		}
		if out, _, code := p.cli("", "metrics", sb.ID, "--since", "1m"); code != 0 || !strings.Contains(out, "CPU%") {
			t.Errorf("corral metrics: %d %s", code, out)
		}
		// Bad input: 400, nothing else.
		for _, q := range []string{"since=yesterday", "since=-5m", "limit=3"} {
			resp := p.get(t, "/v1/sandboxes/"+sb.ID+"/metrics?"+q)
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("metrics?%s: %d, want 400", q, resp.StatusCode)
			}
		}
		if _, _, code := p.cli("", "metrics", sb.ID, "--since", "soon"); code != 2 {
			t.Errorf("corral metrics --since soon: exit %d, want 2", code)
		}
		// Prometheus has the node's sums, and no per-sandbox series unless asked for.
		prom := p.promText(t)
		if !strings.Contains(prom, "corral_node_sandboxes_cpu_percent{") || strings.Contains(prom, "corral_sandbox_cpu_percent{") {
			t.Errorf("/v1/metrics: node sums missing or per-sandbox series present:\n%s", grepLines(prom, "cpu_percent"))
		}
		if _, err := p.Client.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		if m, err := p.Client.SandboxMetrics(ctx, sb.ID, time.Time{}); err != nil || len(m.Samples) == 0 {
			t.Errorf("samples of the deleted sandbox: %d, %v; want them kept", len(m.Samples), err)
		}
		if _, err := p.Client.SandboxMetrics(ctx, "sb-local-aaaaaaaaaaaaaaaa", time.Time{}); !corral.IsNotFound(err) {
			t.Errorf("metrics of an unknown sandbox: %v, want not found", err)
		}
	})
}

// get sends an authenticated GET to the API.
func (p *corralProc) get(t *testing.T, path string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, p.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+p.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// promText returns GET /v1/metrics.
func (p *corralProc) promText(t *testing.T) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, p.URL+"/v1/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+p.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// follower collects an event stream's events in the background.
type follower struct {
	mu   sync.Mutex
	evs  []corral.LifecycleEvent
	err  error
	stop func()
}

func follow(t *testing.T, c *corral.Client, q corral.EventQuery) *follower {
	t.Helper()
	q.Follow = true
	st, err := c.Events(t.Context(), q)
	if err != nil {
		t.Fatal(err)
	}
	f := &follower{stop: func() { st.Close() }}
	t.Cleanup(f.stop)
	go func() {
		for {
			ev, err := st.Next()
			f.mu.Lock()
			if err != nil {
				f.err = err
				f.mu.Unlock()
				return
			}
			f.evs = append(f.evs, ev)
			f.mu.Unlock()
		}
	}()
	return f
}

// of returns the types of the events about sandbox id, in order.
func (f *follower) of(id string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, ev := range f.evs {
		if ev.Sandbox == id {
			out = append(out, ev.Type)
		}
	}
	return out
}

func (f *follower) all() []corral.LifecycleEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]corral.LifecycleEvent(nil), f.evs...)
}

// TestObserveEvents: followers see create → delete in order; a tenant's token sees its
// projects' events only, live and replayed; a follower that never reads holds nothing up.
func TestObserveEvents(t *testing.T) {
	x := newTenancy(t)
	p, ctx := x.p, t.Context()
	root := follow(t, p.Client, corral.EventQuery{})
	fa := follow(t, x.a, corral.EventQuery{})
	fb := follow(t, x.b, corral.EventQuery{})
	// A follower that never reads its stream: Corral goes on regardless.
	stuck := stuckFollower(t, p)
	defer stuck.Close()
	before := time.Now()
	sa, err := x.a.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Project: "a/sub"})
	if err != nil {
		t.Fatal(err)
	}
	sbB, err := x.b.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.a.PauseSandbox(ctx, sa.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := x.a.ResumeSandbox(ctx, sa.ID); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		c  *corral.Client
		id string
	}{{x.a, sa.ID}, {x.b, sbB.ID}} {
		if _, err := c.c.DeleteSandbox(ctx, c.id); err != nil {
			t.Fatal(err)
		}
	}
	want := "[created started paused resumed deleted]"
	eventually(t, 30*time.Second, "a's follower sees its sandbox's life", func() bool { return fmt.Sprint(fa.of(sa.ID)) == want })
	eventually(t, 30*time.Second, "root's follower sees both sandboxes", func() bool {
		return fmt.Sprint(root.of(sa.ID)) == want && fmt.Sprint(root.of(sbB.ID)) == "[created started deleted]"
	})
	eventually(t, 30*time.Second, "b's follower sees its own", func() bool { return fmt.Sprint(fb.of(sbB.ID)) == "[created started deleted]" })
	for _, ev := range fa.all() {
		if ev.Sandbox == sbB.ID || ev.Project == "b" || ev.Type == corral.EventNodeState {
			t.Errorf("a's token saw %+v", ev)
		}
		if ev.Sandbox == sa.ID && (ev.Project != "a/sub" || ev.Node != "local" || ev.ID == "") {
			t.Errorf("event %+v: want project a/sub, node local, an ID", ev)
		}
	}
	for _, ev := range fb.all() {
		if ev.Sandbox == sa.ID {
			t.Errorf("b's token saw %+v", ev)
		}
	}
	// Replay: the same, in order, from the store and the bus.
	st, err := x.a.Events(ctx, corral.EventQuery{Since: before})
	if err != nil {
		t.Fatal(err)
	}
	var replayed []string
	for {
		ev, err := st.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Sandbox == sbB.ID {
			t.Errorf("a's replay has b's %+v", ev)
		}
		if ev.Sandbox == sa.ID {
			replayed = append(replayed, ev.Type)
		}
	}
	if fmt.Sprint(replayed) != want {
		t.Errorf("a's replay = %v, want %s", replayed, want)
	}
	// The CLI, with a type filter.
	out, errOut, code := p.cliAs(x.tokA, "", "", "events", "--since", "10m", "--type", "created,deleted", "-o", "json")
	if code != 0 || strings.Count(out, `"type":"created"`) != 1 || strings.Count(out, `"type":"deleted"`) != 1 || strings.Contains(out, sbB.ID) {
		t.Errorf("corral events as a: %d\n%s%s", code, out, errOut)
	}
	if out, _, code := p.cli("", "events", "--since", "10m"); code != 0 || !strings.Contains(out, "TYPE") || !strings.Contains(out, sbB.ID) {
		t.Errorf("corral events as root: %d\n%s", code, out)
	}
	// Bad input and other tenants' projects.
	for _, q := range []string{"type=exploded", "follow=maybe", "since=later", "project=../x", "color=red"} {
		if resp := p.get(t, "/v1/events?"+q); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("events?%s: %d, want 400", q, resp.StatusCode)
		}
	}
	if _, err := x.b.Events(ctx, corral.EventQuery{Project: "a"}); err == nil {
		t.Error("b's token read a's events")
	}
}

// stuckConn is a follower that reads its response header and then nothing.
type stuckConn struct {
	net.Conn
	r *bufio.Reader
}

func stuckFollower(t *testing.T, p *corralProc) *stuckConn {
	t.Helper()
	c, err := net.Dial("tcp", p.Listen)
	if err != nil {
		t.Fatal(err)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetReadBuffer(1024)
	}
	fmt.Fprintf(c, "GET /v1/events?follow=true HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", p.Token)
	r := bufio.NewReaderSize(c, 16)
	line, err := r.ReadString('\n')
	if err != nil || !strings.Contains(line, "200") {
		t.Fatalf("follow: %q %v", line, err)
	}
	return &stuckConn{Conn: c, r: r}
}

// hookReceiver answers 500 to each event's first delivery and 200 to the next, and keeps what
// it got.
type hookReceiver struct {
	mu     sync.Mutex
	seen   map[string]int
	got    []corral.LifecycleEvent
	badSig []string
	secret string
}

func (h *hookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := webhook.Verify(h.secret, r.Header.Get(corral.SignatureHeader), body, time.Now(), 5*time.Minute); err != nil {
		h.badSig = append(h.badSig, err.Error())
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var ev corral.LifecycleEvent
	json.Unmarshal(body, &ev)
	h.seen[ev.ID]++
	if h.seen[ev.ID] == 1 {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	h.got = append(h.got, ev)
}

func (h *hookReceiver) types(id string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, ev := range h.got {
		if ev.Sandbox == id {
			out = append(out, ev.Type)
		}
	}
	return out
}

// TestObserveWebhooks: a project's webhook gets its subtree's events of the types it names,
// signed, after a retry on 500; the log shows both attempts; a hanging receiver is given up
// and counted; bad URLs are refused; another tenant cannot see or remove it.
func TestObserveWebhooks(t *testing.T) {
	x := newTenancyWith(t, "--webhook-timeout", "500ms", "--webhook-attempts", "2", "--webhook-backoff", "100ms", "--webhook-allow-private")
	p, ctx := x.p, t.Context()
	rc := &hookReceiver{seen: map[string]int{}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	out, errOut, code := p.cliAs(x.tokA, "", "", "webhook", "add", "a", srv.URL+"/hook", "--events", "created,deleted", "-o", "json")
	var hook corral.Webhook
	if code != 0 || json.Unmarshal([]byte(out), &hook) != nil || hook.Secret == "" || hook.Project != "a" {
		t.Fatalf("corral webhook add: %d %s %s", code, out, errOut)
	}
	rc.mu.Lock()
	rc.secret = hook.Secret
	rc.mu.Unlock()
	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer hang.Close()
	defer close(release)
	hung, err := x.a.CreateWebhook(ctx, corral.WebhookRequest{URL: hang.URL, Events: []string{corral.EventCreated}})
	if err != nil {
		t.Fatal(err)
	}
	// Bad input: 400, nothing added.
	for _, u := range []string{"ftp://example.com/x", "not a url", "https://u:p@example.com/", "file:///etc/passwd"} {
		if _, err := x.a.CreateWebhook(ctx, corral.WebhookRequest{URL: u}); !corral.IsInvalid(err) {
			t.Errorf("webhook to %q: %v, want invalid", u, err)
		}
	}
	if _, err := x.a.CreateWebhook(ctx, corral.WebhookRequest{URL: srv.URL, Events: []string{"exploded"}}); !corral.IsInvalid(err) {
		t.Errorf("webhook for an unknown event type: %v, want invalid", err)
	}
	if _, err := x.b.CreateWebhook(ctx, corral.WebhookRequest{Project: "a", URL: srv.URL}); err == nil {
		t.Error("b's token added a webhook to project a")
	}
	if list, err := x.a.Webhooks(ctx, ""); err != nil || len(list) != 2 || list[0].Secret != "" {
		t.Errorf("a's webhooks = %+v, %v (want 2, without secrets)", list, err)
	}
	sa, err := x.a.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Project: "a/sub"})
	if err != nil {
		t.Fatal(err)
	}
	sbB, err := x.b.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		c  *corral.Client
		id string
	}{{x.a, sa.ID}, {x.b, sbB.ID}} {
		if _, err := c.c.DeleteSandbox(ctx, c.id); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "signed created and deleted deliveries, after a 500 each", func() bool {
		return fmt.Sprint(rc.types(sa.ID)) == "[created deleted]"
	})
	if n := len(rc.types(sbB.ID)); n != 0 {
		t.Errorf("a's webhook got %d events of b's sandbox", n)
	}
	rc.mu.Lock()
	if len(rc.badSig) > 0 {
		t.Errorf("deliveries with bad signatures: %v", rc.badSig)
	}
	rc.mu.Unlock()
	out, _, code = p.cliAs(x.tokA, "", "", "webhook", "deliveries", hook.ID, "-o", "json")
	var log []corral.WebhookDelivery
	if code != 0 || json.Unmarshal([]byte(out), &log) != nil {
		t.Fatalf("corral webhook deliveries: %d %s", code, out)
	}
	results := map[string]int{}
	for _, d := range log {
		results[fmt.Sprintf("%s/%d", d.Result, d.Status)]++
	}
	if results["retry/500"] != 2 || results["ok/200"] != 2 {
		t.Errorf("delivery log: %v\n%s", results, out)
	}
	eventually(t, 30*time.Second, "the hanging receiver given up", func() bool {
		log, err := x.a.WebhookDeliveries(ctx, hung.ID)
		return err == nil && len(log) == 2 && log[0].Result == "failed" && log[1].Result == "retry"
	})
	if prom := p.promText(t); !strings.Contains(prom, `corral_webhook_deliveries_total{outcome="failed"} 1`) {
		t.Errorf("/v1/metrics:\n%s", grepLines(prom, "webhook"))
	}
	// Another tenant neither sees nor removes it; its owner does.
	if list, _ := x.b.Webhooks(ctx, ""); len(list) != 0 {
		t.Errorf("b sees webhooks %+v", list)
	}
	if err := x.b.DeleteWebhook(ctx, hook.ID); err == nil {
		t.Error("b removed a's webhook")
	}
	if _, _, code := p.cliAs(x.tokA, "", "", "webhook", "rm", hook.ID); code != 0 {
		t.Errorf("corral webhook rm: exit %d", code)
	}
	if out, _, _ := p.cliAs(x.tokA, "", "", "webhook", "ls"); strings.Contains(out, hook.ID) || !strings.Contains(out, hung.ID) {
		t.Errorf("corral webhook ls after rm:\n%s", out)
	}
}

// exec runs argv in a sandbox over HTTP with the tokens header, returning the status.
func (p *corralProc) execWithTokens(t *testing.T, id string, tokens string, argv ...string) int {
	t.Helper()
	b, _ := json.Marshal(corral.ExecRequest{Argv: argv})
	req, _ := http.NewRequest(http.MethodPost, p.URL+"/v1/sandboxes/"+id+"/exec", strings.NewReader(string(b)))
	req.Header.Set("Authorization", "Bearer "+p.Token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(corral.TokensHeader, tokens)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestObserveReport: the report's figures on a few sandboxes of one project.
func TestObserveReport(t *testing.T) {
	p := withBase(t)
	ctx := context.Background()
	if _, err := p.Client.CreateProject(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	net := &corral.NetworkPolicy{Mode: corral.NetworkAllowlist}
	// killed: its TTL ends it; extended: its TTL is extended, then it is deleted; idle: no exec.
	killed := p.create(corral.CreateRequest{Project: "r", TTL: "3s", Network: net})
	extended := p.create(corral.CreateRequest{Project: "r", TTL: "1h"})
	idle := p.create(corral.CreateRequest{Project: "r"})
	if code := p.execWithTokens(t, killed.ID, "100", "/bin/sh", "-c", "nc -w 1 203.0.113.9 80 </dev/null; true"); code != 200 {
		t.Fatalf("exec with tokens: %d", code)
	}
	if code := p.execWithTokens(t, extended.ID, "250", "true"); code != 200 {
		t.Fatalf("exec with tokens: %d", code)
	}
	if code := p.execWithTokens(t, extended.ID, "lots", "true"); code != http.StatusBadRequest {
		t.Errorf("exec with a bad tokens header: %d, want 400", code)
	}
	if _, err := p.Client.SetTTL(ctx, extended.ID, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{extended.ID, idle.ID} {
		if _, err := p.Client.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "the TTL ends the first sandbox", func() bool {
		sb, err := p.Client.GetSandbox(ctx, killed.ID)
		return err == nil && sb.State == corral.StateStopped
	})
	out, errOut, code := p.cli("", "report", "--project", "r", "--since", "1h", "-o", "json")
	var rep corral.Report
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil {
		t.Fatalf("corral report: %d %s %s", code, out, errOut)
	}
	if rep.Sandboxes != 3 || len(rep.Setup) != 1 || rep.Setup[0].Count != 2 || rep.Setup[0].Tier != "container" || rep.Setup[0].P50Seconds <= 0 ||
		rep.Task.Count != 3 || rep.Task.Tokens != 350 || rep.Task.TokensPerTask != 175 ||
		rep.TTLExtended != 1 || rep.TTLKilled != 1 || rep.BlockedEgress == 0 || rep.Actions < 3 || rep.BlockedPer1000Actions == 0 {
		t.Errorf("report:\n%s", out)
	}
	if out, _, code := p.cli("", "report", "--project", "r"); code != 0 || !strings.Contains(out, "ended by TTL:      1 (33.3%)") {
		t.Errorf("corral report:\n%s", out)
	}
	// Other projects' sandboxes are not in it; bad input is refused.
	if other, err := p.Client.Report(ctx, corral.ReportQuery{Project: "nope"}); err == nil && other.Sandboxes != 0 {
		t.Errorf("report of an empty subtree: %+v", other)
	}
	for _, q := range []string{"since=soon", "project=../x", "color=red"} {
		if resp := p.get(t, "/v1/report?"+q); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("report?%s: %d, want 400", q, resp.StatusCode)
		}
	}
	// The burst of blocked attempts is an event.
	out, _, _ = p.cli("", "events", "--since", "1h", "--type", "egress_blocked", "-o", "json")
	if !strings.Contains(out, killed.ID) {
		t.Errorf("no egress_blocked event of %s:\n%s", killed.ID, out)
	}
}
