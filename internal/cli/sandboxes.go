package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	corral "github.com/corral-dev/corral/sdk/go"
)

func (a *app) newCreateCmd() *cobra.Command {
	var f createFlags
	var project, idemKey string
	cmd := &cobra.Command{
		Use:   "create [flags]",
		Short: "Create a sandbox and print its ID",
		Example: `  corral create --base base:default --memory 1G --cpus 2 --ttl 2h --label task=42
  id=$(corral create) && corral exec "$id" -- uname -a
  corral create --project team-a/rollout-17`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := f.request()
			if err != nil {
				return err
			}
			req.Project, req.IdempotencyKey = project, idemKey
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.CreateSandbox(cmd.Context(), req)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(sb)
			}
			_, err = fmt.Fprintln(a.stdout, sb.ID)
			return err
		},
	}
	f.add(cmd.Flags(), a.getenv)
	cmd.Flags().StringVar(&project, "project", "", "project to create the sandbox in, e.g. team-a/rollout-17 (default: the token's)")
	cmd.Flags().StringVar(&idemKey, "idempotency-key", "", "make a retry safe: the same key and flags within 24h give back the sandbox the first create made")
	return cmd
}

func (a *app) newGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "get ID",
		Short: "Show a sandbox",
		Args:  exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.GetSandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(sb)
			}
			return a.printSandbox(sb)
		},
	}
}

// printSandbox writes the key/value view of a sandbox.
func (a *app) printSandbox(sb *corral.Sandbox) error {
	now := a.now()
	t := newTable(a.stdout)
	state := sb.State
	if sb.Reason != "" {
		state += " (" + sb.Reason + ")"
	}
	lim := sb.Limits
	cpus := "-"
	if lim.CPUs != 0 {
		cpus = strconv.FormatFloat(lim.CPUs, 'f', -1, 64)
	}
	count := func(n int64) string {
		if n == 0 {
			return "-"
		}
		return strconv.FormatInt(n, 10)
	}
	idle := "-"
	if sb.IdleTTLSeconds > 0 {
		idle = (time.Duration(sb.IdleTTLSeconds) * time.Second).String()
	}
	for _, kv := range [][2]string{
		{"ID:", sb.ID},
		{"State:", state},
		{"Project:", orDash(sb.Project)},
		{"Node:", orDash(sb.Node)},
		{"Tier:", orDash(sb.Tier)},
		{"Runtime:", orDash(sb.Runtime + orEmpty(" on ", sb.Accelerator))},
		{"Fetch:", orDash(sb.Fetch)},
		{"Network:", policyLine(sb.Network)},
		{"Address:", orDash(sb.NetworkAddress)},
		{"Blocked:", egressLine(sb.Egress)},
		{"Forked from:", orDash(sb.ForkedFrom)},
		{"Hostname:", orDash(sb.Hostname)},
		{"Image:", orDash(sb.Image)},
		{"Base:", orDash(sb.Base)},
		{"Workspace:", orDash(sb.Workspace)},
		{"Toolkits:", orDash(strings.Join(sb.Toolkits, ", "))},
		{"CPUs:", cpus},
		{"Memory:", formatBytes(lim.MemoryBytes)},
		{"Disk:", formatBytes(lim.DiskBytes)},
		{"Pids:", count(lim.Pids)},
		{"Open files:", count(lim.OpenFiles)},
		{"Output limit:", formatBytes(lim.OutputBytes)},
		{"Volumes:", orDash(volumeMounts(sb.Volumes))},
		{"Env:", orDash(strings.Join(sb.Env, " "))},
		{"Labels:", orDash(formatLabels(sb.Labels))},
		{"Created:", formatTime(sb.CreatedAt, now)},
		{"Expires:", formatTime(sb.ExpiresAt, now)},
		{"Idle TTL:", idle},
		{"Last activity:", formatTime(sb.LastActivityAt, now)},
		{"Ended:", formatTime(sb.EndedAt, now)},
	} {
		t.row(kv[0], kv[1])
	}
	return t.flush()
}

// volumeMounts is a sandbox's volumes as "data:/data, cache:/cache:ro".
func volumeMounts(ms []corral.VolumeMount) string {
	var out []string
	for _, m := range ms {
		s := m.Name + ":" + m.Path
		if m.ReadOnly {
			s += ":ro"
		}
		out = append(out, s)
	}
	return strings.Join(out, ", ")
}

func (a *app) newLsCmd() *cobra.Command {
	var state, project string
	var labels []string
	cmd := &cobra.Command{
		Use:     "ls [--state S] [--label K=V ...] [--project PATH]",
		Aliases: []string{"list"},
		Short:   "List sandboxes",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			want, err := parseKV("label", labels)
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.ListSandboxes(cmd.Context(), corral.ListOptions{State: state, Labels: want, Project: project})
			if err != nil {
				return err
			}
			if a.jsonOut() {
				if list == nil {
					list = []corral.Sandbox{}
				}
				return a.printJSON(list)
			}
			now := a.now()
			t := newTable(a.stdout, "ID", "STATE", "BASE", "CREATED", "EXPIRES", "PROJECT", "LABELS")
			for _, sb := range list {
				st := sb.State
				if sb.Reason != "" {
					// One line per sandbox: a reason may quote a log's last lines
					// (`corral get ID` shows it whole).
					r, _, cut := strings.Cut(sb.Reason, "\n")
					if cut || len(r) > 100 {
						r = strings.TrimSpace(r[:min(len(r), 100)]) + " …"
					}
					st += " (" + r + ")"
				}
				expires := relTime(sb.ExpiresAt, now)
				if sb.State != corral.StateRunning && sb.State != corral.StateCreating {
					expires = "-"
				}
				t.row(sb.ID, st, orDash(sb.Base), relTime(sb.CreatedAt, now), expires, orDash(sb.Project), orDash(formatLabels(sb.Labels)))
			}
			return t.flush()
		},
	}
	cmd.Flags().StringVar(&state, "state", "", "only sandboxes in this state: creating, running, paused, off, deleting, stopped, failed")
	cmd.Flags().StringArrayVar(&labels, "label", nil, "only sandboxes with this label KEY=VALUE (repeatable; all must match)")
	cmd.Flags().StringVar(&project, "project", "", "only sandboxes in this project's subtree")
	return cmd
}

func (a *app) newRmCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "rm ID...",
		Aliases: []string{"delete"},
		Short:   "Delete sandboxes, killing their commands",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("rm wants at least one sandbox ID")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			deleted := []*corral.Sandbox{}
			failed := 0
			for _, id := range args {
				sb, err := c.DeleteSandbox(cmd.Context(), id)
				if err != nil {
					// Keep going: one bad ID should not leave the other sandboxes running.
					fmt.Fprintf(a.stderr, "corral: %s: %s\n", id, a.describe(err))
					failed++
					continue
				}
				deleted = append(deleted, sb)
				if !a.jsonOut() {
					fmt.Fprintln(a.stdout, sb.ID)
				}
			}
			if a.jsonOut() {
				if err := a.printJSON(deleted); err != nil {
					return err
				}
			}
			if failed > 0 {
				return exitError{1}
			}
			return nil
		},
	}
}

func (a *app) newTTLCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "ttl ID DURATION",
		Short:   "Make a sandbox expire DURATION from now (extend or shorten its life)",
		Example: `  corral ttl sb-local-0123456789abcdef 2h`,
		Args:    exactArgs(2, "a sandbox ID and a duration"),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := time.ParseDuration(args[1])
			if err != nil || d <= 0 {
				return usagef("duration %q: want a positive duration such as 30m or 2h", args[1])
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.SetTTL(cmd.Context(), args[0], d)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(sb)
			}
			_, err = fmt.Fprintf(a.stdout, "%s expires %s\n", sb.ID, formatTime(sb.ExpiresAt, a.now()))
			return err
		},
	}
}

func (a *app) newInfoCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "info",
		Short: "Show what the server says about itself",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			info, err := c.Info(cmd.Context())
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(info)
			}
			t := newTable(a.stdout)
			for _, kv := range [][2]string{
				{"Server:", a.url},
				{"Version:", orDash(info.Version)},
				{"Node:", orDash(info.Node)},
				{"Runtime:", orDash(info.Runtime)},
				{"Runtime path:", orDash(info.RuntimePath)},
				{"Runtime version:", orDash(info.RuntimeVersion)},
				{"Runtimes:", strings.Join(info.Runtimes, ", ")},
				{"gVisor:", gvisorLine(info)},
				{"LXCFS:", lxcfsLine(info)},
				{"User namespaces:", usernsLine(info)},
				{"Tiers:", orDash(strings.Join(info.Tiers, ", "))},
				{"MicroVM:", microvmLine(info)},
				{"Networking:", networkingLine(info)},
				{"Cgroup version:", orDash(info.CgroupVersion)},
				{"Data dir:", orDash(info.DataDir)},
				{"Sandboxes:", strconv.Itoa(info.Sandboxes)},
				{"Disk:", diskLine(info.Disk)},
			} {
				t.row(kv[0], kv[1])
			}
			return t.flush()
		},
	}
}

// microvmLine says what microvm sandboxes run on here, and why, or why there are none.
func microvmLine(info *corral.Info) string {
	switch {
	case info.MicroVMAccelerator != "":
		l := info.MicroVMAccelerator
		if info.MicroVMAccelerator == "tcg" {
			l += " (software emulation, several times slower than KVM)"
		}
		if info.MicroVMAcceleratorWhy != "" {
			l += "; " + info.MicroVMAcceleratorWhy
		}
		if info.QEMUVersion != "" {
			l += "; " + info.QEMUVersion
		}
		return l
	case info.MicroVMUnavailable != "":
		return "unavailable: " + info.MicroVMUnavailable
	}
	return "-"
}

func gvisorLine(info *corral.Info) string {
	if info.GVisorVersion != "" {
		return info.GVisorVersion
	}
	return orDash(info.GVisorUnavailable)
}

// lxcfsLine says whether container sandboxes see their own /proc figures (LXCFS) or the host's.
func lxcfsLine(info *corral.Info) string {
	switch {
	case info.LXCFSVersion != "":
		return "in use (" + info.LXCFSVersion + "): container sandboxes see their own memory, CPUs and uptime in /proc"
	case info.LXCFSUnavailable != "":
		return "off: " + info.LXCFSUnavailable + " (container sandboxes see the host's /proc/meminfo, cpuinfo, uptime)"
	}
	return "-"
}

// usernsLine says whether a container sandbox's root is an unprivileged host uid.
func usernsLine(info *corral.Info) string {
	switch {
	case info.UserNS != "":
		return "in use with idmapped mounts: container sandboxes' root is an unprivileged host uid (" + info.UserNS + ")"
	case info.UserNSUnavailable != "":
		return "off: " + info.UserNSUnavailable + " (container sandboxes' root is the host's root, confined by capabilities and seccomp)"
	}
	return "-"
}

// diskLine says what the node has promised of its data dir's filesystem and what it can hold.
func diskLine(d *corral.DiskAccount) string {
	if d == nil {
		return "-"
	}
	return fmt.Sprintf("%s promised of %s (free %s + %s allocated, ×%g)", formatBytes(d.PromisedBytes), formatBytes(d.HaveBytes),
		formatBytes(d.FreeBytes), formatBytes(d.AllocatedBytes), d.Overcommit)
}

func networkingLine(info *corral.Info) string {
	if info.NetworkPool != "" {
		return "on, pool " + info.NetworkPool
	}
	return "off: " + orDash(info.NetworkOff)
}
