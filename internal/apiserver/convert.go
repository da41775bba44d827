package apiserver

import (
	"github.com/corral-dev/corral/internal/build"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/lazy"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/report"
	"github.com/corral-dev/corral/internal/store"
)

// Packages behind the API keep types of their own (issue 29 item 5: lazyd's control protocol
// must not change when the SDK does, and the SDK is a module of its own); these functions turn
// them into the API's where a handler writes them, and nowhere else.

// fetchStats is lazyd's fetch statistics as the API's FetchStats.
func fetchStats(st lazy.Stats) model.FetchStats {
	return model.FetchStats{
		Layer: st.Layer, Sandbox: st.Sandbox,
		DataSize: st.DataSize, Chunks: st.Chunks, CachedChunks: st.CachedChunks, CachedBytes: st.CachedBytes, Open: st.Open,
		BytesRead: st.BytesRead, Hits: st.Hits, Misses: st.Misses,
		BytesFetched: st.BytesFetched, Fetches: st.Fetches, FetchErrors: st.FetchErrors, Corrupt: st.Corrupt, ReadErrors: st.ReadErrors,
		FillBytes:    st.FillBytes,
		Prefetch:     model.PrefetchStats(st.Prefetch),
		FetchLatency: model.LatencyHistogram(st.FetchLatency),
		LastError:    st.LastError, LastErrorAt: st.LastErrorAt,
	}
}

// chunkCacheStats is lazyd's chunk cache statistics as the API's ChunkCacheStats.
func chunkCacheStats(st lazy.CacheStats) model.ChunkCacheStats {
	return model.ChunkCacheStats(st)
}

// apiReport is a report on project as the API's Report.
func apiReport(rep report.Report, project string) model.Report {
	out := model.Report{Project: project, Since: rep.Since, Until: rep.Until, Sandboxes: rep.Sandboxes,
		Setup: make([]model.SetupTime, len(rep.Setup)), Task: model.TaskTime(rep.Task),
		Actions: rep.Actions, BlockedEgress: rep.BlockedEgress, BlockedPer1000Actions: rep.BlockedPer1000Actions,
		TTLExtended: rep.TTLExtended, TTLKilled: rep.TTLKilled, TTLExtendedShare: rep.TTLExtendedShare, TTLKilledShare: rep.TTLKilledShare}
	for i, s := range rep.Setup {
		out.Setup[i] = model.SetupTime(s)
	}
	return out
}

// lifecycleEvent is an event of the bus or the store as the API's LifecycleEvent (the same
// fields: the conversion does not compile if one side gains a field the other lacks).
func lifecycleEvent(ev events.Event) model.LifecycleEvent {
	return model.LifecycleEvent(ev)
}

// webhookDelivery is an entry of a webhook's delivery log as the API's WebhookDelivery (the same
// fields: the conversion does not compile if one side gains a field the other lacks).
func webhookDelivery(d store.WebhookDelivery) model.WebhookDelivery {
	return model.WebhookDelivery(d)
}

// buildSpec is a build request as internal/build takes it (the same fields; the network policy
// is netpolicy's, the same fields too).
func buildSpec(r model.BuildRequest) build.Spec {
	return build.Spec{Name: r.Name, Dockerfile: r.Dockerfile, BuildArgs: r.BuildArgs, Network: (*netpolicy.Policy)(r.Network),
		Runtime: r.Runtime, Project: r.Project, From: r.From, NoCache: r.NoCache}
}

// apiBuild is a build's state as the API's Build.
func apiBuild(b build.Build) model.Build {
	out := model.Build{ID: b.ID, Name: b.Name, Project: b.Project, State: b.State, Error: b.Error, From: b.From,
		Warnings: b.Warnings, Layer: b.Layer, CreatedAt: b.CreatedAt, FinishedAt: b.FinishedAt}
	if b.Steps != nil {
		out.Steps = make([]model.BuildStep, len(b.Steps))
		for i, st := range b.Steps {
			out.Steps[i] = model.BuildStep(st)
		}
	}
	return out
}

// apiBuildEvent is an entry of a build's log as the API's BuildEvent.
func apiBuildEvent(ev build.Event) model.BuildEvent {
	out := model.BuildEvent{Type: ev.Type, Step: ev.Step, Text: ev.Text, Cached: ev.Cached, Data: ev.Data}
	if ev.Build != nil {
		b := apiBuild(*ev.Build)
		out.Build = &b
	}
	return out
}
