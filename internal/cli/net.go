package cli

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	corral "github.com/corral-dev/corral/sdk/go"
)

func (a *app) newNetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "net",
		Short: "A sandbox's egress policy: replace it, list blocked attempts, list the service catalog",
	}
	var nf netFlags
	set := &cobra.Command{
		Use:   "set ID [--net none|allowlist|open] [--net-allow RULE]... [--net-deny RULE]...",
		Short: "Replace a running sandbox's egress policy (open connections included)",
		Example: `  corral net set sb-local-0123456789abcdef --net-allow pypi --net-allow '*.example.com'
  corral net set sb-local-0123456789abcdef --net none`,
		Args: exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := nf.policy()
			if err != nil {
				return err
			}
			if p == nil {
				return usagef("say what the policy is: --net, --net-allow or --net-deny")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.SetNetwork(cmd.Context(), args[0], *p)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(sb)
			}
			_, err = fmt.Fprintf(a.stdout, "%s network: %s\n", sb.ID, policyLine(sb.Network))
			return err
		},
	}
	nf.add(set.Flags())
	log := &cobra.Command{
		Use:   "log ID",
		Short: "List a running sandbox's latest blocked egress attempts",
		Args:  exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.BlockedAttempts(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(list)
			}
			t := newTable(a.stdout)
			t.row("AT", "REASON", "PROTOCOL", "DESTINATION", "PORT")
			for _, b := range list {
				dest := b.Dest
				if b.Name != "" {
					dest = b.Name
				}
				t.row(b.At.Format("15:04:05.000"), b.Reason, b.Protocol, orDash(dest), strconv.Itoa(b.Port))
			}
			return t.flush()
		},
	}
	var setFile string
	services := &cobra.Command{
		Use:   "services [--set FILE]",
		Short: "List the operator's network service catalog, or replace it (--set FILE, the --services JSON shape)",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var list []corral.NetworkService
			if setFile != "" {
				raw, rerr := os.ReadFile(setFile)
				if rerr != nil {
					return rerr
				}
				list, err = c.SetNetworkServices(cmd.Context(), raw)
			} else {
				list, err = c.NetworkServices(cmd.Context())
			}
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(list)
			}
			t := newTable(a.stdout)
			t.row("NAME", "DOMAINS", "ADDRESSES", "DESCRIPTION")
			for _, s := range list {
				t.row(s.Name, orDash(strings.Join(s.Domains, ",")), orDash(strings.Join(s.Addresses, ",")), orDash(s.Description))
			}
			return t.flush()
		},
	}
	services.Flags().StringVar(&setFile, "set", "", "replace the catalog with this JSON file")
	cmd.AddCommand(set, log, services)
	return cmd
}

// policyLine is a policy in one line: "allowlist allow=pypi,*.example.com deny=-".
func policyLine(p *corral.NetworkPolicy) string {
	if p == nil || p.Mode == "" {
		return "none"
	}
	s := p.Mode
	if len(p.Allow) > 0 {
		s += " allow=" + strings.Join(p.Allow, ",")
	}
	if len(p.Deny) > 0 {
		s += " deny=" + strings.Join(p.Deny, ",")
	}
	return s
}

// egressLine summarises blocked attempts: "3 (no_rule 2, dns_refused 1), 12.5 per 1000 actions".
func egressLine(e *corral.EgressStats) string {
	if e == nil {
		return "-"
	}
	keys := make([]string, 0, len(e.Blocked))
	for k, v := range e.Blocked {
		if v > 0 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, e.Blocked[k])
	}
	s := strconv.FormatUint(e.BlockedTotal, 10)
	if len(parts) > 0 {
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	return s + fmt.Sprintf(", %.1f per 1000 actions", e.BlockedPer1000Actions)
}
