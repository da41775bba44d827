package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/edge"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/report"
	"github.com/corral-dev/corral/internal/store"
	"github.com/corral-dev/corral/internal/webhook"
)

// The observability routes (issue 28): the event stream, webhooks and the report. Per-sandbox
// metrics are the edge's (GET /v1/sandboxes/{id}/metrics, routed like the data plane).

// Event stream bounds.
const (
	// followBuffer is how many events a follower may fall behind before it is dropped.
	followBuffer = 1024
	// eventWriteTimeout bounds one write to a follower: a client that stops reading is cut off
	// instead of holding its handler forever.
	eventWriteTimeout = 10 * time.Second
	// replayLimit bounds the past events one request replays.
	replayLimit = 10000
)

// clusterObserveRoutes adds what observes more than one sandbox: the event stream, the usage
// report, webhooks. A cluster's servers serve them (ServerHandler); so does corral up.
func (s *Server) clusterObserveRoutes(api *http.ServeMux) {
	api.HandleFunc("GET /v1/events", s.events)
	api.HandleFunc("GET /v1/report", s.guard(iam.SandboxRead, "", s.onQueryProject("project", ""), s.report))
	api.HandleFunc("POST /v1/webhooks", s.createWebhook)
	api.HandleFunc("GET /v1/webhooks", s.guard(iam.SandboxRead, "", s.onQueryProject("project", ""), s.listWebhooks))
	api.HandleFunc("DELETE /v1/webhooks/{id}", s.guard(iam.SandboxAdmin, "webhook.delete", s.onWebhook, s.deleteWebhook))
	api.HandleFunc("POST /v1/webhooks/{id}/test", s.guard(iam.SandboxAdmin, "webhook.test", s.onWebhook, s.testWebhook))
	api.HandleFunc("GET /v1/webhooks/{id}/deliveries", s.guard(iam.SandboxRead, "", s.onWebhook, s.webhookDeliveries))
}

// SetWebhooks gives the server the dispatcher that delivers this process's events, so a webhook
// added or removed through it takes effect at once (otherwise within the dispatcher's refresh).
func (s *Server) SetWebhooks(d *webhook.Dispatcher) { s.hooks = d }

// eventFilter says which events a request sees: those of the project's subtree the caller may
// read, of the types asked for.
func eventFilter(c *caller, under string, types []string) func(events.Event) bool {
	return func(ev events.Event) bool {
		p, err := iam.ParsePath("project", ev.Project)
		if err != nil || !iam.Within(p, under) || !c.perms(p).Has(iam.SandboxRead) {
			return false
		}
		return len(types) == 0 || slices.Contains(types, ev.Type)
	}
}

// events serves GET /v1/events?project=&since=&type=&follow=: NDJSON, past events first (those
// at or after since; without follow, the last hour by default), then, with follow, new ones as
// they happen. A follower that falls behind by followBuffer events gets an error line
// (exhausted) and the stream ends; the client reconnects with since.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for k := range q {
		if k != "project" && k != "since" && k != "type" && k != "follow" {
			s.fail(w, r, errdefs.Invalid(k, "unknown query parameter"))
			return
		}
	}
	c := who(r)
	under, err := c.project("project", q.Get("project"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if err := c.require(iam.SandboxRead, under); err != nil {
		s.fail(w, r, err)
		return
	}
	var types []string
	for _, v := range q["type"] {
		for t := range strings.SplitSeq(v, ",") {
			if !slices.Contains(model.EventTypes, t) {
				s.fail(w, r, errdefs.Invalid("type", "%q is not an event type (%s)", t, strings.Join(model.EventTypes, ", ")))
				return
			}
			types = append(types, t)
		}
	}
	follow := false
	switch q.Get("follow") {
	case "", "false":
	case "true":
		follow = true
	default:
		s.fail(w, r, errdefs.Invalid("follow", "%q: want true or false", q.Get("follow")))
		return
	}
	now := time.Now()
	since, err := edge.ParseSince("since", q.Get("since"), now)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if since.IsZero() && !follow {
		since = now.Add(-time.Hour)
	}
	match := eventFilter(c, under, types)
	// corral up's events are on its bus before they reach the store; a cluster server's are
	// read from the store, where every edge records its own.
	var bus *events.Bus
	if s.edge != nil && !s.edge.SharedStore() {
		bus = s.edge.Events()
	}
	shared := bus == nil
	var sub *events.Sub
	if follow && !shared {
		sub, _ = bus.Subscribe(followBuffer, time.Time{}, match)
		defer sub.Close()
	}
	// The past: the store's copy, and the bus's events it may not have yet.
	seen := map[string]time.Time{}
	var past []events.Event
	if !since.IsZero() {
		stored, err := s.store.ListEvents(r.Context(), under, since, replayLimit)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		for _, ev := range stored {
			if match(ev) {
				past = append(past, ev)
			}
		}
		if !shared {
			past = append(past, bus.Recent(since, match)...)
		}
		sort.SliceStable(past, func(i, j int) bool { return past[i].At.Before(past[j].At) })
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	send := func(v any) bool {
		rc.SetWriteDeadline(time.Now().Add(eventWriteTimeout))
		if enc.Encode(v) != nil {
			return false
		}
		return rc.Flush() == nil
	}
	for _, ev := range past {
		if _, ok := seen[ev.ID]; ok {
			continue
		}
		seen[ev.ID] = ev.At
		if !send(lifecycleEvent(ev)) {
			return
		}
	}
	if !follow {
		return
	}
	rc.Flush()
	if shared {
		list := func(ctx context.Context, since time.Time, limit int) ([]events.Event, error) {
			return s.store.ListEvents(ctx, under, since, limit)
		}
		err := events.Follow(r.Context(), list, replayLimit, now, seen, func(ev events.Event) bool {
			return !match(ev) || send(lifecycleEvent(ev))
		})
		if err != nil {
			send(map[string]string{"code": errdefs.Code(err), "message": err.Error()})
		}
		return
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case ev, ok := <-sub.C():
			if !ok {
				if sub.Dropped() {
					send(map[string]string{"code": model.CodeExhausted, "message": "the event stream fell behind (the client read too slowly) and was dropped; reconnect with since"})
				}
				return
			}
			if _, ok := seen[ev.ID]; ok {
				continue
			}
			if !send(lifecycleEvent(ev)) {
				return
			}
		}
	}
}

func (s *Server) report(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for k := range q {
		if k != "project" && k != "since" {
			s.fail(w, r, errdefs.Invalid(k, "unknown query parameter"))
			return
		}
	}
	c := who(r)
	under, err := c.project("project", q.Get("project"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	now := time.Now().UTC()
	sinceArg := q.Get("since")
	if sinceArg == "" {
		sinceArg = "7d"
	}
	since, err := edge.ParseSince("since", sinceArg, now)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	rows, err := s.store.ListUsage(r.Context(), under, since)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// A report over a project covers what the caller may read below it.
	rows = slices.DeleteFunc(rows, func(u store.Usage) bool { return !c.perms(u.ProjectPath).Has(iam.SandboxRead) })
	httpjson.Write(w, http.StatusOK, apiReport(report.Compute(rows, since, now), iam.Display(under)))
}

func (s *Server) createWebhook(w http.ResponseWriter, r *http.Request) {
	var req model.WebhookRequest
	if err := httpjson.Decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	c := who(r)
	project, err := c.project("project", req.Project)
	if err == nil {
		err = c.require(iam.SandboxAdmin, project)
	}
	if err == nil {
		err = webhook.ValidateRequest(req.URL, req.Events)
	}
	if err == nil && s.hooks != nil {
		err = s.hooks.CheckTarget(req.URL)
	}
	if err != nil {
		s.audit(r, "webhook.create", project, req.URL, err, "")
		s.fail(w, r, err)
		return
	}
	rec := &store.WebhookRecord{
		Webhook: model.Webhook{ID: webhook.NewID(), Project: iam.Display(project), URL: req.URL, Events: req.Events,
			CreatedAt: time.Now().UTC(), CreatedBy: c.tok.Principal},
		ProjectPath: project, SecretKey: webhook.NewSecret(),
	}
	if err := s.store.CreateWebhook(r.Context(), rec); err != nil {
		s.audit(r, "webhook.create", project, req.URL, err, "")
		s.fail(w, r, err)
		return
	}
	s.audit(r, "webhook.create", project, rec.ID, nil, req.URL)
	if s.hooks != nil {
		s.hooks.Refresh(r.Context())
	}
	out := rec.Webhook
	out.Secret = rec.SecretKey // shown this once
	httpjson.Write(w, http.StatusCreated, out)
}

func (s *Server) listWebhooks(w http.ResponseWriter, r *http.Request) {
	c := who(r)
	under, _ := c.project("project", r.URL.Query().Get("project"))
	list, err := s.store.Webhooks(r.Context(), under)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := []model.Webhook{}
	for _, h := range list {
		if c.perms(h.ProjectPath).Has(iam.SandboxRead) {
			out = append(out, h.Webhook)
		}
	}
	httpjson.Write(w, http.StatusOK, out)
}

// onWebhook resolves to the project of the webhook in the path.
func (s *Server) onWebhook(r *http.Request) (string, string, error) {
	id := r.PathValue("id")
	h, err := s.store.Webhook(r.Context(), id)
	if err != nil {
		return "", id, err
	}
	return h.ProjectPath, id, nil
}

func (s *Server) deleteWebhook(w http.ResponseWriter, r *http.Request) {
	if err := s.store.DeleteWebhook(r.Context(), r.PathValue("id")); err != nil {
		s.fail(w, r, err)
		return
	}
	if s.hooks != nil {
		s.hooks.Refresh(r.Context())
	}
	w.WriteHeader(http.StatusNoContent)
}

// testWebhook serves POST /v1/webhooks/{id}/test: one test delivery now, answered with the
// attempt (corral.WebhookDelivery).
func (s *Server) testWebhook(w http.ResponseWriter, r *http.Request) {
	if s.hooks == nil {
		s.fail(w, r, errdefs.Unavailable("this server runs no webhook dispatcher"))
		return
	}
	h, err := s.store.Webhook(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, webhookDelivery(s.hooks.Test(r.Context(), h, who(r).tok.Principal)))
}

func (s *Server) webhookDeliveries(w http.ResponseWriter, r *http.Request) {
	list, err := s.store.Deliveries(r.Context(), r.PathValue("id"), 100)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]model.WebhookDelivery, len(list)) // [] when none, never null
	for i, d := range list {
		out[i] = webhookDelivery(d)
	}
	httpjson.Write(w, http.StatusOK, out)
}

// WriteWebhookMetrics adds the webhook dispatcher's counters to the Prometheus output (none
// without a dispatcher).
func (s *Server) WriteWebhookMetrics(w io.Writer) {
	if s.hooks == nil {
		return
	}
	st := s.hooks.Stats()
	fmt.Fprintf(w, "# HELP corral_webhook_deliveries_total Webhook deliveries by outcome (retry counts attempts retried; dropped, deliveries a full queue refused).\n# TYPE corral_webhook_deliveries_total counter\n")
	for _, o := range []struct {
		k string
		v uint64
	}{{"delivered", st.Delivered}, {"retry", st.Retried}, {"failed", st.Failed}, {"dropped", st.Dropped}} {
		fmt.Fprintf(w, "corral_webhook_deliveries_total{outcome=%q} %d\n", o.k, o.v)
	}
	fmt.Fprintf(w, "# HELP corral_webhook_dispatcher_behind_total Times the dispatcher fell behind the event bus (events not delivered).\n# TYPE corral_webhook_dispatcher_behind_total counter\ncorral_webhook_dispatcher_behind_total %d\n", st.Lost)
}
