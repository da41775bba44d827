package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	corral "github.com/corral-dev/corral/sdk/go"
)

// The observability commands (issue 28): metrics, events, webhook, report.

func (a *app) newMetricsCmd() *cobra.Command {
	var watch bool
	var since string
	cmd := &cobra.Command{
		Use:   "metrics ID [--since 10m] [--watch]",
		Short: "Show a sandbox's resource samples (CPU, memory, disk, network, tasks)",
		Long: "Show the resource samples the sandbox's node keeps of it: one every few seconds for its life and a\n" +
			"while after (corral up --sample-interval, --metrics-keep). With --watch, a chart of the latest\n" +
			"minutes, redrawn at every new sample, until interrupted.",
		Example: `  corral metrics sb-local-abc --since 5m
  corral metrics sb-local-abc --watch
  corral metrics sb-local-abc -o json`,
		Args: exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var from time.Time
			if since != "" {
				d, err := parseAge(since)
				if err != nil {
					return usagef("--since: %v", err)
				}
				from = a.now().Add(-d)
			}
			if watch {
				return a.watchMetrics(cmd.Context(), c, args[0], from)
			}
			m, err := c.SandboxMetrics(cmd.Context(), args[0], from)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(m)
			}
			t := newTable(a.stdout, "AT", "CPU%", "MEMORY", "PEAK", "DISK", "NET RX", "NET TX", "PIDS")
			for _, s := range m.Samples {
				t.row(s.At.Local().Format(time.TimeOnly), strconv.FormatFloat(s.CPUPercent, 'f', 1, 64), formatBytes(s.MemoryBytes),
					formatBytes(s.MemoryPeakBytes), formatBytes(s.DiskBytes), formatBytes(s.NetRxBytes), formatBytes(s.NetTxBytes),
					strconv.FormatInt(s.Pids, 10))
			}
			return t.flush()
		},
	}
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "redraw a chart at every new sample until interrupted")
	cmd.Flags().StringVar(&since, "since", "", "only samples of this last while (30s, 10m, 2h, 1d)")
	return cmd
}

// parseAge reads a duration back from now: Go's form, or whole days ("7d").
func parseAge(s string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.Atoi(n)
		if err != nil || days < 0 {
			return 0, fmt.Errorf("%q is not a duration (30s, 10m, 2h, 7d)", s)
		}
		return time.Duration(days) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q is not a duration (30s, 10m, 2h, 7d)", s)
	}
	return d, nil
}

// chartWidth is how many samples a --watch chart shows.
const chartWidth = 60

// watchMetrics redraws the chart of the newest samples until ctx ends or the sandbox's samples
// stop coming. The screen is cleared through the raw stream (Corral's own control sequence);
// everything drawn goes through the escaping one.
func (a *app) watchMetrics(ctx context.Context, c *corral.Client, id string, from time.Time) error {
	var samples []corral.MetricSample
	interval := 5 * time.Second
	tty := isTerminal(a.rawStdout)
	for {
		m, err := c.SandboxMetrics(ctx, id, from)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if m.IntervalSeconds > 0 {
			interval = time.Duration(m.IntervalSeconds * float64(time.Second))
		}
		samples = append(samples, m.Samples...)
		if len(samples) > chartWidth {
			samples = samples[len(samples)-chartWidth:]
		}
		if n := len(m.Samples); n > 0 || from.IsZero() {
			if n > 0 {
				from = m.Samples[n-1].At
			}
			if tty {
				io.WriteString(a.rawStdout, "\x1b[H\x1b[2J")
			}
			if err := a.drawChart(id, samples); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

// drawChart writes one frame: a sparkline per resource over the samples, with the latest value.
func (a *app) drawChart(id string, samples []corral.MetricSample) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s  (%d samples", id, len(samples))
	if n := len(samples); n > 0 {
		fmt.Fprintf(&b, ", latest %s", samples[n-1].At.Local().Format(time.TimeOnly))
	}
	b.WriteString(")\n")
	rows := []struct {
		name string
		v    func(s corral.MetricSample) float64
		fmt  func(v float64) string
	}{
		{"cpu", func(s corral.MetricSample) float64 { return s.CPUPercent }, func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) + "%" }},
		{"memory", func(s corral.MetricSample) float64 { return float64(s.MemoryBytes) }, func(v float64) string { return formatBytes(int64(v)) }},
		{"disk", func(s corral.MetricSample) float64 { return float64(s.DiskBytes) }, func(v float64) string { return formatBytes(int64(v)) }},
		{"net rx", func(s corral.MetricSample) float64 { return float64(s.NetRxBytes) }, func(v float64) string { return formatBytes(int64(v)) }},
		{"net tx", func(s corral.MetricSample) float64 { return float64(s.NetTxBytes) }, func(v float64) string { return formatBytes(int64(v)) }},
		{"pids", func(s corral.MetricSample) float64 { return float64(s.Pids) }, func(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }},
	}
	for _, r := range rows {
		vals := make([]float64, len(samples))
		for i, s := range samples {
			vals[i] = r.v(s)
		}
		last := "-"
		if len(vals) > 0 {
			last = r.fmt(vals[len(vals)-1])
		}
		fmt.Fprintf(&b, "%-7s %-*s %s\n", r.name, chartWidth, sparkline(vals), last)
	}
	_, err := io.WriteString(a.stdout, b.String())
	return err
}

// sparkline draws vals as block characters scaled from 0 to their maximum.
func sparkline(vals []float64) string {
	const blocks = "▁▂▃▄▅▆▇█"
	levels := []rune(blocks)
	top := 0.0
	for _, v := range vals {
		top = max(top, v)
	}
	var b strings.Builder
	for _, v := range vals {
		i := 0
		if top > 0 {
			i = min(int(v/top*float64(len(levels)-1)+0.5), len(levels)-1)
		}
		b.WriteRune(levels[i])
	}
	return b.String()
}

func (a *app) newEventsCmd() *cobra.Command {
	var q corral.EventQuery
	var since, types string
	cmd := &cobra.Command{
		Use:   "events [--project PATH] [--since 1h] [--type created,deleted] [--follow]",
		Short: "List what happened to sandboxes and nodes, and follow new events",
		Long: "List the events of a project's subtree (default: the token's project) that the token may read:\n" +
			strings.Join(corral.EventTypes, ", ") + ".\n" +
			"Without --follow, those of the last hour (or --since); with it, new ones as they happen.",
		Example: `  corral events --since 10m
  corral events --follow --project team-a --type created,deleted,failed
  corral events --follow -o json | jq .`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if since != "" {
				d, err := parseAge(since)
				if err != nil {
					return usagef("--since: %v", err)
				}
				q.Since = a.now().Add(-d)
			}
			if types != "" {
				q.Types = strings.Split(types, ",")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			st, err := c.Events(cmd.Context(), q)
			if err != nil {
				return err
			}
			defer st.Close()
			go func() {
				<-cmd.Context().Done()
				st.Close()
			}()
			var t *table
			if !a.jsonOut() {
				t = newTable(a.stdout, "AT", "TYPE", "SANDBOX", "PROJECT", "NODE", "REASON")
			}
			for {
				ev, err := st.Next()
				if errors.Is(err, io.EOF) || errors.Is(err, corral.ErrStreamClosed) {
					if t != nil {
						return t.flush()
					}
					return nil
				}
				if err != nil {
					if t != nil {
						t.flush()
					}
					return err
				}
				if a.jsonOut() {
					if err := a.printJSONLine(ev); err != nil {
						return err
					}
					continue
				}
				reason := ev.Reason
				if ev.Count > 0 {
					reason = fmt.Sprintf("%d× %s", ev.Count, reason)
				}
				t.row(ev.At.Local().Format(time.DateTime), ev.Type, orDash(ev.Sandbox), orDash(ev.Project), orDash(ev.Node), orDash(reason))
				if q.Follow {
					t.flush() // a follower sees each event as it comes
				}
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&q.Project, "project", "", "only events in this project's subtree (default: the token's project)")
	f.StringVar(&since, "since", "", "events of this last while (30s, 10m, 2h, 7d; default 1h, or none past with --follow)")
	f.StringVar(&types, "type", "", "only these types, comma-separated")
	f.BoolVarP(&q.Follow, "follow", "f", false, "keep the stream open and print new events as they happen")
	return cmd
}

// printJSONLine writes v as one line of JSON (a stream's NDJSON).
func (a *app) printJSONLine(v any) error {
	b, err := jsonLine(v)
	if err != nil {
		return err
	}
	_, err = a.stdout.Write(b)
	return err
}

func (a *app) newWebhookCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "webhook",
		Short: "Send a project's events to a URL, signed (add, ls, rm, test, deliveries)",
		Long: "A webhook POSTs each event of its project's subtree (of the types it names) as JSON to its URL,\n" +
			"with the header Corral-Signature: t=UNIX,v1=HEX, HEX being HMAC-SHA256 under the webhook's\n" +
			"secret of \"UNIX.\" followed by the body. A delivery that times out or is answered with a 5xx or\n" +
			"429 is retried with backoff, a few times; every attempt is in the delivery log.",
	}
	var events string
	add := &cobra.Command{
		Use:     "add PROJECT URL [--events created,deleted,...]",
		Short:   "Add a webhook; its secret is shown this once",
		Example: `  corral webhook add team-a https://hooks.example.com/corral --events created,deleted,failed`,
		Args:    exactArgs(2, "a project and a URL"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			req := corral.WebhookRequest{Project: args[0], URL: args[1]}
			if events != "" {
				req.Events = strings.Split(events, ",")
			}
			h, err := c.CreateWebhook(cmd.Context(), req)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(h)
			}
			fmt.Fprintf(a.stdout, "%s\nsecret: %s\n(the secret is not shown again; receivers verify the %s header with it)\n", h.ID, h.Secret, corral.SignatureHeader)
			return nil
		},
	}
	add.Flags().StringVar(&events, "events", "", "event types to send, comma-separated (default: all): "+strings.Join(corral.EventTypes, ","))
	var project string
	ls := &cobra.Command{
		Use:   "ls [--project PATH]",
		Short: "List webhooks",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.Webhooks(cmd.Context(), project)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(nonNil(list))
			}
			t := newTable(a.stdout, "ID", "PROJECT", "URL", "EVENTS", "CREATED")
			for _, h := range list {
				ev := strings.Join(h.Events, ",")
				if ev == "" {
					ev = "all"
				}
				t.row(h.ID, h.Project, h.URL, ev, h.CreatedAt.Local().Format(time.DateTime))
			}
			return t.flush()
		},
	}
	ls.Flags().StringVar(&project, "project", "", "only webhooks of this project's subtree (default: the token's project)")
	rm := &cobra.Command{
		Use:   "rm ID",
		Short: "Remove a webhook",
		Args:  exactArgs(1, "a webhook ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.DeleteWebhook(cmd.Context(), args[0])
		},
	}
	deliveries := &cobra.Command{
		Use:   "deliveries ID",
		Short: "Show a webhook's latest delivery attempts, newest first",
		Args:  exactArgs(1, "a webhook ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.WebhookDeliveries(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(nonNil(list))
			}
			t := newTable(a.stdout, "AT", "EVENT", "TYPE", "ATTEMPT", "STATUS", "RESULT", "MS", "ERROR")
			for _, d := range list {
				status := "-"
				if d.Status > 0 {
					status = strconv.Itoa(d.Status)
				}
				t.row(d.At.Local().Format(time.DateTime), d.Event, d.Type, strconv.Itoa(d.Attempt), status, d.Result,
					strconv.FormatFloat(d.DurationMs, 'f', 1, 64), orDash(d.Error))
			}
			return t.flush()
		},
	}
	test := &cobra.Command{
		Use:   "test ID",
		Short: "Send the webhook one test event now and show how its receiver answered",
		Args:  exactArgs(1, "a webhook ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			d, err := c.TestWebhook(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(d)
			}
			fmt.Fprintf(a.stdout, "%s %s: status %d in %.1f ms %s\n", d.Event, d.Result, d.Status, d.DurationMs, d.Error)
			if d.Result != "ok" {
				return fmt.Errorf("test delivery to webhook %s failed: %s", args[0], d.Error)
			}
			return nil
		},
	}
	cmd.AddCommand(add, ls, rm, deliveries, test)
	return cmd
}

func (a *app) newReportCmd() *cobra.Command {
	var q corral.ReportQuery
	var since string
	cmd := &cobra.Command{
		Use:   "report [--since 7d] [--project PATH]",
		Short: "The weekly instruments: setup time, time and tokens per task, blocked egress, TTL outcomes",
		Long: "Report on the sandboxes created in a period (default the last 7 days) in a project's subtree:\n" +
			"  setup time        create → first exec, p50 and p99, by tier and environment\n" +
			"  task              wall-clock per sandbox (created → ended), and the model tokens clients\n" +
			"                    reported with the " + corral.TokensHeader + " header\n" +
			"  blocked egress    blocked egress attempts per 1000 data-plane actions\n" +
			"  TTL               the share of sandboxes whose TTL was extended, and of those it ended",
		Example: `  corral report
  corral report --since 30d --project team-a -o json`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if since != "" {
				d, err := parseAge(since)
				if err != nil || d == 0 {
					return usagef("--since: want a positive duration (30m, 24h, 7d)")
				}
				q.Since = d
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			rep, err := c.Report(cmd.Context(), q)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(rep)
			}
			fmt.Fprintf(a.stdout, "project %s, %s to %s: %d sandboxes\n\n", rep.Project, rep.Since.Local().Format(time.DateTime),
				rep.Until.Local().Format(time.DateTime), rep.Sandboxes)
			secs := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) + "s" }
			t := newTable(a.stdout, "SETUP (CREATE → FIRST EXEC)", "ENVIRONMENT", "N", "P50", "P99")
			for _, s := range rep.Setup {
				t.row(s.Tier, orDash(s.Environment), strconv.Itoa(s.Count), secs(s.P50Seconds), secs(s.P99Seconds))
			}
			t.flush()
			fmt.Fprintf(a.stdout, "\ntask wall-clock:   %d ended, p50 %s, p99 %s\n", rep.Task.Count, secs(rep.Task.P50Seconds), secs(rep.Task.P99Seconds))
			fmt.Fprintf(a.stdout, "tokens reported:   %d (%.0f per task that reported)\n", rep.Task.Tokens, rep.Task.TokensPerTask)
			fmt.Fprintf(a.stdout, "blocked egress:    %d in %d actions (%.2f per 1000 actions)\n", rep.BlockedEgress, rep.Actions, rep.BlockedPer1000Actions)
			fmt.Fprintf(a.stdout, "TTL extended:      %d (%.1f%%)\n", rep.TTLExtended, 100*rep.TTLExtendedShare)
			fmt.Fprintf(a.stdout, "ended by TTL:      %d (%.1f%%)\n", rep.TTLKilled, 100*rep.TTLKilledShare)
			return nil
		},
	}
	cmd.Flags().StringVar(&since, "since", "", "the period, back from now (default 7d)")
	cmd.Flags().StringVar(&q.Project, "project", "", "the project whose subtree to report on (default: the token's project)")
	return cmd
}

// jsonLine encodes v as one line of JSON with its newline.
func jsonLine(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	return append(b, '\n'), err
}
