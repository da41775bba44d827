package cli

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/iam"
	corral "github.com/corral-dev/corral/sdk/go"
)

// The commands of this file manage who may do what, where: the project tree, principals and
// their grants, quotas, tokens, and the audit log. The server decides every permission; the
// commands check only what they can check alone (a role's name, a size, a duration).

var (
	roles = []string{corral.RoleViewer, corral.RoleUser, corral.RoleAdmin, corral.RoleOwner}
	kinds = []string{corral.KindUser, corral.KindService, corral.KindAgent}
	// permissions are the permissions a token can be given one by one (corral token create
	// --permission).
	permissions = []string{
		corral.PermSandboxRead, corral.PermSandboxCreate, corral.PermSandboxUse, corral.PermSandboxAdmin,
		corral.PermLayerRead, corral.PermLayerPublish, corral.PermProjectRead, corral.PermProjectCreate,
		corral.PermProjectGrant, corral.PermQuotaDelegate, corral.PermAuditRead, corral.PermOperator,
	}
)

// checkRole checks a role named by what (an argument or a flag).
func checkRole(what, role string) error {
	if !slices.Contains(roles, role) {
		return usagef("%s %q: want viewer, user, admin or owner", what, role)
	}
	return nil
}

// checkKind checks a principal kind given with --kind.
func checkKind(kind string) error {
	if !slices.Contains(kinds, kind) {
		return usagef("--kind %q: want user, service or agent", kind)
	}
	return nil
}

// nonNil returns list, or an empty list for nil, so -o json prints [] rather than null.
func nonNil[T any](list []T) []T {
	if list == nil {
		return []T{}
	}
	return list
}

func (a *app) newWhoamiCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "whoami",
		Short: "Show the principal and token you act as, and what the token may do",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			me, err := c.Whoami(cmd.Context())
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(me)
			}
			t := newTable(a.stdout)
			for _, kv := range [][2]string{
				{"Principal:", me.Principal.Name},
				{"Kind:", orDash(me.Principal.Kind)},
				{"Project:", orDash(me.Token.Project)},
				{"Token:", orDash(me.Token.ID)},
				{"Role:", orDash(me.Token.Role)},
				{"Permissions:", orDash(strings.Join(me.Permissions, ", "))},
				{"Expires:", formatTimePtr(me.Token.ExpiresAt, a.now())},
			} {
				t.row(kv[0], kv[1])
			}
			return t.flush()
		},
	}
}

// formatTimePtr is formatTime for an optional time; nil is "-".
func formatTimePtr(t *time.Time, now time.Time) string {
	if t == nil {
		return "-"
	}
	return formatTime(*t, now)
}

func (a *app) newProjectCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "project",
		Short: "Create, list, move and delete projects (the tree sandboxes, layers and quotas live in)",
		Long: `Projects form a tree under the root project "/"; a path names one, such as
team-a/rollout-17. A role granted on a project holds in its whole subtree, and a project's quota
bounds its whole subtree.`,
		Args: exactArgs(0, "a subcommand: create, ls, tree, rm or mv"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmd.Help()
		},
	}
	create := &cobra.Command{
		Use:     "create PATH",
		Short:   "Create a project (its parent must exist) and print its path",
		Example: `  corral project create team-a && corral project create team-a/rollout-17`,
		Args:    exactArgs(1, "a project PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			p, err := c.CreateProject(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(p)
			}
			_, err = fmt.Fprintln(a.stdout, p.Path)
			return err
		},
	}

	var lsUnder string
	ls := &cobra.Command{
		Use:     "ls [--under PATH]",
		Aliases: []string{"list"},
		Short:   "List the projects you can see, parents before children",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.Projects(cmd.Context(), lsUnder)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(nonNil(list))
			}
			now := a.now()
			t := newTable(a.stdout, "PATH", "SANDBOXES", "ID", "CREATED", "CREATOR")
			for _, p := range list {
				t.row(p.Path, strconv.Itoa(p.Sandboxes), p.ID, relTime(p.CreatedAt, now), orDash(p.CreatedBy))
			}
			return t.flush()
		},
	}
	ls.Flags().StringVar(&lsUnder, "under", "", "only this project and its subtree")

	var treeUnder string
	tree := &cobra.Command{
		Use:   "tree [--under PATH]",
		Short: "Show the project tree with each project's live sandboxes",
		Long: `Show the project tree with the live (creating, running, paused, off) sandboxes of each project
itself. With -o json the tree is one nested object:
{"path": "/", "id": "...", "sandboxes": N, "children": [...]}. When the projects you can see
have no common visible parent, the top node is --under (or "/") with an empty id.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.Projects(cmd.Context(), treeUnder)
			if err != nil {
				return err
			}
			root := projectTree(list, treeUnder)
			if a.jsonOut() {
				return a.printJSON(root)
			}
			t := newTable(a.stdout, "PROJECT", "SANDBOXES")
			var walk func(n *projectNode, depth int)
			walk = func(n *projectNode, depth int) {
				name, count := n.Path, strconv.Itoa(n.Sandboxes)
				if depth > 0 {
					name = path.Base(n.Path)
				}
				if n.ID == "" {
					count = "-"
				}
				t.row(strings.Repeat("  ", depth)+name, count)
				for _, ch := range n.Children {
					walk(ch, depth+1)
				}
			}
			walk(root, 0)
			return t.flush()
		},
	}
	tree.Flags().StringVar(&treeUnder, "under", "", "the subtree of this project only")

	var rmForce bool
	rm := &cobra.Command{
		Use:   "rm PATH [--force]",
		Short: "Delete a project and its subtree (refused while it has live sandboxes, unless --force)",
		Args:  exactArgs(1, "a project PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.DeleteProject(cmd.Context(), args[0], rmForce)
		},
	}
	rm.Flags().BoolVar(&rmForce, "force", false, "delete the subtree's live sandboxes first, then its volumes")

	var mvForce bool
	mv := &cobra.Command{
		Use:     "mv FROM TO [--force]",
		Short:   "Move (or rename) a project and its subtree; TO's parent must exist",
		Example: `  corral project mv team-a/rollout-17 team-b/rollout-17`,
		Args:    exactArgs(2, "FROM and TO project paths"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			p, err := c.MoveProject(cmd.Context(), corral.MoveProjectRequest{From: args[0], To: args[1], Force: mvForce})
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(p)
			}
			_, err = fmt.Fprintln(a.stdout, p.Path)
			return err
		},
	}
	mv.Flags().BoolVar(&mvForce, "force", false, "move even with live sandboxes in the subtree")

	cmd.AddCommand(create, ls, tree, rm, mv, a.newPlacementCmd())
	return cmd
}

// newPlacementCmd returns `corral project placement`: the node groups a project is pinned to
// or kept off in a cluster.
func (a *app) newPlacementCmd() *cobra.Command {
	var pin, avoid []string
	var clear bool
	cmd := &cobra.Command{
		Use:   "placement PATH [--pin KEY=VALUE[,KEY=VALUE]]... [--avoid KEY=VALUE[,...]]... [--clear]",
		Short: "Show or set the node groups a project's sandboxes are pinned to or kept off (operator)",
		Long: `Show or set a project's placement in a cluster. A node group is a label selector, the
labels a node must all carry (corral edge --label). With --pin the project's sandboxes run only
on nodes matching one of the pinned groups; with --avoid never on a node matching an avoided
group. Subprojects inherit: the nearest pin on the way up applies, and every avoid. Without
flags the placement is shown; setting one replaces it, --clear removes it.`,
		Example: `  corral project placement team-a --pin pool=team-a --avoid gpu=h100
  corral project placement team-a/rollout-17 -o json
  corral project placement team-a --clear`,
		Args: exactArgs(1, "a project PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var pl *corral.ProjectPlacement
			if len(pin) == 0 && len(avoid) == 0 && !clear {
				pl, err = c.ProjectPlacement(cmd.Context(), args[0])
			} else if clear && (len(pin) > 0 || len(avoid) > 0) {
				return usagef("--clear removes the placement: drop --pin and --avoid")
			} else {
				var set corral.ProjectPlacement
				if set.Pin, err = parseSelectors("pin", pin); err == nil {
					set.Avoid, err = parseSelectors("avoid", avoid)
				}
				if err != nil {
					return err
				}
				pl, err = c.SetProjectPlacement(cmd.Context(), args[0], set)
			}
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(pl)
			}
			groups := func(list []map[string]string) string {
				var out []string
				for _, s := range list {
					out = append(out, formatLabels(s))
				}
				return orDash(strings.Join(out, " | "))
			}
			t := newTable(a.stdout, "", "PIN", "AVOID")
			t.row("own", groups(pl.Pin), groups(pl.Avoid))
			if pl.Effective != nil {
				t.row("effective", groups(pl.Effective.Pin), groups(pl.Effective.Avoid))
			}
			return t.flush()
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&pin, "pin", nil, "pin to the nodes carrying all these labels, KEY=VALUE[,KEY=VALUE] (repeatable: any of the groups)")
	f.StringArrayVar(&avoid, "avoid", nil, "keep off the nodes carrying all these labels (repeatable)")
	f.BoolVar(&clear, "clear", false, "remove the project's own placement")
	return cmd
}

// parseSelectors parses repeated KEY=VALUE[,KEY=VALUE] flags into label selectors.
func parseSelectors(flag string, values []string) ([]map[string]string, error) {
	var out []map[string]string
	for _, v := range values {
		s, err := parseKV(flag, strings.Split(v, ","))
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// projectNode is one project of `corral project tree -o json`.
type projectNode struct {
	Path      string         `json:"path"`
	ID        string         `json:"id"`
	Sandboxes int            `json:"sandboxes"`
	Children  []*projectNode `json:"children"`
}

// projectTree nests a project list (parents before children) by each project's parent. A list
// with several tops, or none, hangs them under a node for under (or the root) that has no ID: a
// project the caller cannot see.
func projectTree(list []corral.Project, under string) *projectNode {
	nodes := make(map[string]*projectNode, len(list))
	for _, p := range list {
		nodes[p.Path] = &projectNode{Path: p.Path, ID: p.ID, Sandboxes: p.Sandboxes, Children: []*projectNode{}}
	}
	var tops []*projectNode
	for _, p := range list {
		n := nodes[p.Path]
		if parent, ok := nodes[p.Parent]; ok && p.Parent != "" && parent != n {
			parent.Children = append(parent.Children, n)
		} else {
			tops = append(tops, n)
		}
	}
	if len(tops) == 1 {
		return tops[0]
	}
	top := strings.Trim(under, "/")
	if top == "" {
		top = corral.RootProject
	}
	return &projectNode{Path: top, Children: nonNil(tops)}
}

func (a *app) newGrantCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "grant PATH PRINCIPAL ROLE",
		Short: "Give a principal a role (viewer, user, admin or owner) on a project and its subtree",
		Long: `Give a principal a role on a project and its subtree. Roles include the ones before them:
viewer reads; user also creates and uses sandboxes; admin also manages sandboxes, publishes
layers, creates subprojects, sets their quotas and reads the audit log; owner also grants roles
and mints tokens for others. You must hold project.grant and every permission of the role there.`,
		Example: `  corral grant team-a alice user`,
		Args:    exactArgs(3, "a project PATH, a PRINCIPAL and a ROLE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkRole("role", args[2]); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			g, err := c.Grant(cmd.Context(), corral.Grant{Project: args[0], Principal: args[1], Role: args[2]})
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(g)
			}
			_, err = fmt.Fprintf(a.stdout, "%s: %s on %s\n", g.Principal, g.Role, g.Project)
			return err
		},
	}
}

func (a *app) newGrantsCmd() *cobra.Command {
	var project string
	cmd := &cobra.Command{
		Use:   "grants [--project PATH]",
		Short: "List the roles granted in a project's subtree",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.Grants(cmd.Context(), project)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(nonNil(list))
			}
			now := a.now()
			t := newTable(a.stdout, "PROJECT", "PRINCIPAL", "ROLE", "CREATED", "CREATOR")
			for _, g := range list {
				t.row(g.Project, g.Principal, g.Role, relTime(g.CreatedAt, now), orDash(g.CreatedBy))
			}
			return t.flush()
		},
	}
	cmd.Flags().StringVar(&project, "project", "", "only grants in this project's subtree (default: all you can see)")
	return cmd
}

func (a *app) newRevokeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "revoke PATH PRINCIPAL [ROLE]",
		Short: "Take a role (or, without ROLE, every role) on a project from a principal",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 || len(args) > 3 {
				return usagef("%s wants a project PATH, a PRINCIPAL and optionally a ROLE, got %d argument(s)", cmd.CommandPath(), len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			g := corral.Grant{Project: args[0], Principal: args[1]}
			if len(args) == 3 {
				if err := checkRole("role", args[2]); err != nil {
					return err
				}
				g.Role = args[2]
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.Revoke(cmd.Context(), g)
		},
	}
}

func (a *app) newPrincipalCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "principal",
		Short: "Create and list principals (people, services, agents)",
		Args:  exactArgs(0, "a subcommand: create or ls"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmd.Help()
		},
	}
	var kind, createProject string
	create := &cobra.Command{
		Use:   "create NAME [--kind user|service|agent] [--project PATH]",
		Short: "Create a principal and print its name (grant it a role with corral grant)",
		Example: `  corral principal create ci --kind service --project team-a
  corral grant team-a ci user`,
		Args: exactArgs(1, "a principal NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkKind(kind); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			p, err := c.CreatePrincipal(cmd.Context(), corral.Principal{Name: args[0], Kind: kind, Project: createProject})
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(p)
			}
			_, err = fmt.Fprintln(a.stdout, p.Name)
			return err
		},
	}
	create.Flags().StringVar(&kind, "kind", corral.KindUser, "what the principal is: user, service or agent")
	create.Flags().StringVar(&createProject, "project", "", "project to create the principal in (default: the token's)")

	var lsProject string
	ls := &cobra.Command{
		Use:     "ls [--project PATH]",
		Aliases: []string{"list"},
		Short:   "List the principals created in a project's subtree",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.Principals(cmd.Context(), lsProject)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(nonNil(list))
			}
			now := a.now()
			t := newTable(a.stdout, "NAME", "KIND", "PROJECT", "CREATED", "CREATOR")
			for _, p := range list {
				t.row(p.Name, p.Kind, p.Project, relTime(p.CreatedAt, now), orDash(p.CreatedBy))
			}
			return t.flush()
		},
	}
	ls.Flags().StringVar(&lsProject, "project", "", "only principals created in this project's subtree (default: all you can see)")
	cmd.AddCommand(create, ls)
	return cmd
}

func (a *app) newQuotaCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "quota",
		Short: "Show and set project quotas",
		Long: `A project's quota bounds what its whole subtree uses at once: live sandboxes, their CPUs,
memory and disk, sandboxes created per minute, and live sandboxes per tier. A project's own
quota is set by whoever holds quota.delegate on its parent; the ancestors' quotas hold too.`,
		Args: exactArgs(0, "a subcommand: show or set"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmd.Help()
		},
	}
	show := &cobra.Command{
		Use:   "show PATH",
		Short: "Show a project's limits, its subtree's usage, and how much its children hold",
		Args:  exactArgs(1, "a project PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			q, err := c.Quota(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(q)
			}
			return a.printQuota(q)
		},
	}

	var sandboxes, cpus, memory, disk, creates, artifacts string
	var tiers []string
	set := &cobra.Command{
		Use:   "set PATH [--sandboxes N] [--cpus N] [--memory SIZE] [--disk SIZE] [--creates-per-minute N] [--artifact-bytes SIZE] [--tier NAME=N ...]",
		Short: "Change some of a project's limits (none removes one), keeping the others",
		Example: `  corral quota set team-a --sandboxes 20 --memory 64G
  corral quota set team-a/rollout-17 --cpus none --tier container=5`,
		Args: exactArgs(1, "a project PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			// Every flag is parsed before the server is asked, so a typo changes nothing.
			var edits []func(*corral.Quota)
			for _, f := range []struct {
				name, value string
				size        bool
				dst         func(*corral.Quota) **int64
			}{
				{"sandboxes", sandboxes, false, func(q *corral.Quota) **int64 { return &q.Sandboxes }},
				{"memory", memory, true, func(q *corral.Quota) **int64 { return &q.MemoryBytes }},
				{"disk", disk, true, func(q *corral.Quota) **int64 { return &q.DiskBytes }},
				{"creates-per-minute", creates, false, func(q *corral.Quota) **int64 { return &q.CreatesPerMinute }},
				{"artifact-bytes", artifacts, true, func(q *corral.Quota) **int64 { return &q.ArtifactBytes }},
			} {
				if !cmd.Flags().Changed(f.name) {
					continue
				}
				v, err := parseLimit(f.name, f.value, f.size)
				if err != nil {
					return err
				}
				edits = append(edits, func(q *corral.Quota) { *f.dst(q) = v })
			}
			if cmd.Flags().Changed("cpus") {
				var v *float64
				if cpus != "none" {
					n, err := strconv.ParseFloat(cpus, 64)
					if err != nil || n < 0 {
						return usagef("--cpus %q: want a number of cores (0.5, 4) or none", cpus)
					}
					v = &n
				}
				edits = append(edits, func(q *corral.Quota) { q.CPUs = v })
			}
			for _, kv := range tiers {
				name, n, ok := strings.Cut(kv, "=")
				if !ok || name == "" {
					return usagef("--tier %q: want NAME=N or NAME=none", kv)
				}
				v, err := parseLimit("tier "+name, n, false)
				if err != nil {
					return err
				}
				edits = append(edits, func(q *corral.Quota) {
					q.Tiers = maps.Clone(q.Tiers)
					if v == nil {
						delete(q.Tiers, name)
					} else {
						if q.Tiers == nil {
							q.Tiers = map[string]int64{}
						}
						q.Tiers[name] = *v
					}
					if len(q.Tiers) == 0 {
						q.Tiers = nil
					}
				})
			}
			if len(edits) == 0 {
				return usagef("say which limits to change: --sandboxes, --cpus, --memory, --disk, --creates-per-minute, --artifact-bytes or --tier")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			cur, err := c.Quota(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			limit := cur.Limit
			for _, edit := range edits {
				edit(&limit)
			}
			q, err := c.SetQuota(cmd.Context(), args[0], limit)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(q)
			}
			return a.printQuota(q)
		},
	}
	f := set.Flags()
	f.StringVar(&sandboxes, "sandboxes", "", "most live sandboxes in the subtree, or none")
	f.StringVar(&cpus, "cpus", "", "most CPU cores the subtree's live sandboxes may be limited to in all, or none")
	f.StringVar(&memory, "memory", "", "most memory in all, e.g. 64G, or none")
	f.StringVar(&disk, "disk", "", "most writable disk in all, e.g. 500G, or none")
	f.StringVar(&creates, "creates-per-minute", "", "most sandboxes created in any minute, or none")
	f.StringVar(&artifacts, "artifact-bytes", "", "most bytes of fncall artifacts the subtree keeps on each node, e.g. 2G, or none (unset: 1G for the project's own)")
	f.StringArrayVar(&tiers, "tier", nil, "most live sandboxes of a tier, NAME=N or NAME=none (repeatable)")
	cmd.AddCommand(show, set)
	return cmd
}

// parseLimit parses a quota flag's value: a count, or a size when size is set; "none" is nil
// (no limit).
func parseLimit(flag, s string, size bool) (*int64, error) {
	if s == "none" {
		return nil, nil
	}
	if size {
		n, err := parseSize(s)
		if err != nil {
			return nil, usagef("--%s: %v, or none", flag, err)
		}
		return &n, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return nil, usagef("--%s %q: want a whole number or none", flag, s)
	}
	return &n, nil
}

// printQuota writes a project's quota as a table: one row per resource, "-" for no limit.
func (a *app) printQuota(q *corral.ProjectQuota) error {
	count := func(v *int64) string {
		if v == nil {
			return "-"
		}
		return strconv.FormatInt(*v, 10)
	}
	cores := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return strconv.FormatFloat(*v, 'f', -1, 64)
	}
	size := func(v *int64) string {
		if v == nil {
			return "-"
		}
		return bytesOrZero(*v)
	}
	l, u, d := q.Limit, q.Usage, q.Delegated
	t := newTable(a.stdout, "RESOURCE", "LIMIT", "USAGE", "DELEGATED")
	t.row("sandboxes", count(l.Sandboxes), strconv.FormatInt(u.Sandboxes, 10), count(d.Sandboxes))
	t.row("cpus", cores(l.CPUs), strconv.FormatFloat(u.CPUs, 'f', -1, 64), cores(d.CPUs))
	t.row("memory", size(l.MemoryBytes), bytesOrZero(u.MemoryBytes), size(d.MemoryBytes))
	t.row("disk", size(l.DiskBytes), bytesOrZero(u.DiskBytes), size(d.DiskBytes))
	t.row("creates-per-minute", count(l.CreatesPerMinute), strconv.FormatInt(u.CreatesPerMinute, 10), count(d.CreatesPerMinute))
	if l.ArtifactBytes != nil || d.ArtifactBytes != nil {
		t.row("artifact-bytes", size(l.ArtifactBytes), "-", size(d.ArtifactBytes)) // usage is per node
	}
	names := slices.Sorted(maps.Keys(l.Tiers))
	for tier := range u.Tiers {
		names = append(names, tier)
	}
	for tier := range d.Tiers {
		names = append(names, tier)
	}
	slices.Sort(names)
	for _, tier := range slices.Compact(names) {
		lim, del := "-", "-"
		if n, ok := l.Tiers[tier]; ok {
			lim = strconv.FormatInt(n, 10)
		}
		if n, ok := d.Tiers[tier]; ok {
			del = strconv.FormatInt(n, 10)
		}
		t.row("tier "+tier, lim, strconv.FormatInt(u.Tiers[tier], 10), del)
	}
	return t.flush()
}

// bytesOrZero is formatBytes with 0 shown as "0", for columns where "-" means no limit.
func bytesOrZero(n int64) string {
	if n == 0 {
		return "0"
	}
	return formatBytes(n)
}

// quotaLine renders a quota refusal for people, sizes in binary units.
func quotaLine(q *corral.QuotaExceeded) string {
	v := func(f float64) string {
		if strings.HasSuffix(q.Resource, "_bytes") {
			return bytesOrZero(int64(f))
		}
		return strconv.FormatFloat(f, 'f', -1, 64)
	}
	return fmt.Sprintf("project %s: %s limit %s, in use %s, requested %s", q.Project, q.Resource, v(q.Limit), v(q.Usage), v(q.Request))
}

func (a *app) newTokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Mint, list and revoke API tokens",
		Args:  exactArgs(0, "a subcommand: create, ls or revoke"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmd.Help()
		},
	}
	var req corral.TokenRequest
	var e2bKey bool
	create := &cobra.Command{
		Use:   "create --project PATH (--role ROLE | --permission P ...) [--ttl DURATION] [--principal NAME | --kind KIND --name NAME]",
		Short: "Mint a token that acts in one project's subtree and print its secret",
		Long: `Mint a token that acts in one project's subtree, with a role's permissions (--role) or
some permissions one by one (--permission), never more than your own token has there. The token
is yours unless --principal names another principal, or --kind/--name create a new one (an agent
unless --kind says otherwise) in the project with --role granted there.

The secret is printed alone on stdout, so TOK=$(corral token create ...) keeps it; it is shown
only this once. -o json prints the whole token record, secret included. With --e2b the secret is
printed as its E2B alias instead (e2b_ and lowercase hex, the shape E2B's SDKs demand of
E2B_API_KEY): the same token, accepted wherever the token is.`,
		Example: `  TOK=$(corral token create --project team-a/rollout-17 --role user --ttl 2h --kind agent)
  CORRAL_TOKEN=$TOK corral create
  E2B_API_KEY=$(corral token create --project team-a --role user --e2b) python3 agent.py`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if req.Role != "" {
				if err := checkRole("--role", req.Role); err != nil {
					return err
				}
			}
			for _, p := range req.Permissions {
				if !slices.Contains(permissions, p) {
					return usagef("--permission %q: want one of %s", p, strings.Join(permissions, ", "))
				}
			}
			if req.Kind != "" {
				if err := checkKind(req.Kind); err != nil {
					return err
				}
			}
			if req.TTL != "" {
				if d, err := time.ParseDuration(req.TTL); err != nil || d <= 0 {
					return usagef("--ttl %q: want a positive duration such as 30m or 2h", req.TTL)
				}
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			tok, err := c.CreateToken(cmd.Context(), req)
			if err != nil {
				return err
			}
			secret := tok.Token
			if e2bKey {
				if secret, err = iam.E2BKey(tok.Token); err != nil {
					return fmt.Errorf("the server's token has no E2B alias: %w", err)
				}
			}
			if a.jsonOut() {
				if e2bKey {
					return a.printJSON(struct {
						*corral.Token
						E2BKey string `json:"e2b_key"`
					}{tok, secret})
				}
				return a.printJSON(tok)
			}
			if _, err := fmt.Fprintln(a.stdout, secret); err != nil {
				return err
			}
			expires := "never expires"
			if tok.ExpiresAt != nil {
				expires = "expires " + relTime(*tok.ExpiresAt, a.now())
			}
			fmt.Fprintf(a.stderr, "Token %s for %s in project %s, %s, %s. The secret above is shown only this once.\n",
				tok.ID, tok.Principal, tok.Project, tokenAccess(*tok), expires)
			return nil
		},
	}
	f := create.Flags()
	f.StringVar(&req.Project, "project", "", "project the token acts in (with its subtree); required")
	f.StringVar(&req.Role, "role", "", "give the token a role's permissions: viewer, user, admin or owner")
	f.StringArrayVar(&req.Permissions, "permission", nil, "give the token this permission, e.g. sandbox.read (repeatable)")
	f.StringVar(&req.TTL, "ttl", "", "how long the token lives, e.g. 2h (default: until revoked)")
	f.StringVar(&req.Principal, "principal", "", "mint for this existing principal (default: yourself)")
	f.StringVar(&req.Kind, "kind", "", "create a new principal of this kind for the token: agent (the default), service or user")
	f.StringVar(&req.Name, "name", "", "create a new principal with this name for the token (default: a generated one)")
	f.BoolVar(&e2bKey, "e2b", false, "print the token as its E2B alias (e2b_<hex>), for E2B_API_KEY")
	create.MarkFlagRequired("project")
	create.MarkFlagsOneRequired("role", "permission")
	create.MarkFlagsMutuallyExclusive("role", "permission")
	create.MarkFlagsMutuallyExclusive("principal", "kind")
	create.MarkFlagsMutuallyExclusive("principal", "name")

	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the tokens you can manage, revoked and expired ones included",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.Tokens(cmd.Context())
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(nonNil(list))
			}
			now := a.now()
			t := newTable(a.stdout, "ID", "PRINCIPAL", "PROJECT", "ACCESS", "STATE", "CREATED", "EXPIRES", "PARENT")
			for _, tok := range list {
				state, expires := "active", "-"
				if tok.ExpiresAt != nil {
					expires = relTime(*tok.ExpiresAt, now)
					if !now.Before(*tok.ExpiresAt) {
						state = "expired"
					}
				}
				if tok.RevokedAt != nil {
					state = "revoked"
				}
				t.row(tok.ID, tok.Principal, tok.Project, tokenAccess(tok), state, relTime(tok.CreatedAt, now), expires, orDash(tok.Parent))
			}
			return t.flush()
		},
	}
	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a token and every token minted from it",
		Args:  exactArgs(1, "a token ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			tok, err := c.RevokeToken(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(tok)
			}
			_, err = fmt.Fprintln(a.stdout, tok.ID)
			return err
		},
	}
	e2b := &cobra.Command{
		Use:   "e2b-key [TOKEN]",
		Short: "Print a token's E2B alias (e2b_<hex>), for E2B_API_KEY",
		Long: `Print the E2B alias of TOKEN, or of the token this command would use (--token-file,
$CORRAL_TOKEN, the admin token file): "e2b_" and the token's secret in lowercase hex, the only
shape E2B's SDKs accept as an API key. The alias is the token itself, written another way: Corral
and its E2B gateway accept it wherever they accept the token, and revoking the token revokes it.
Nothing is asked of the server.`,
		Example: `  export E2B_API_KEY=$(corral token e2b-key)`,
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			tok := ""
			if len(args) == 1 {
				tok = args[0]
			} else {
				if _, err := a.client(); err != nil {
					return err
				}
				tok = a.token
			}
			if tok == "" {
				return usagef("no token: give one, or set CORRAL_TOKEN or --token-file")
			}
			key, err := iam.E2BKey(tok)
			if err != nil {
				return usagef("%v", err)
			}
			_, err = fmt.Fprintln(a.stdout, key)
			return err
		},
	}
	cmd.AddCommand(create, ls, revoke, e2b)
	return cmd
}

// tokenAccess says what a token may do: "role user", or its permissions.
func tokenAccess(t corral.Token) string {
	if t.Role != "" {
		return "role " + t.Role
	}
	return orDash(strings.Join(t.Permissions, ","))
}

func (a *app) newAuditCmd() *cobra.Command {
	var q corral.AuditQuery
	cmd := &cobra.Command{
		Use:   "audit [--project PATH] [--action A] [--limit N] [--before ID]",
		Short: "List management actions in a project's subtree, newest first",
		Example: `  corral audit --project team-a --action sandbox. --limit 20
  corral audit --action token.mint -o json`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if q.Limit < 0 || q.Before < 0 {
				return usagef("--limit and --before must not be negative")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.Audit(cmd.Context(), q)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(nonNil(list))
			}
			t := newTable(a.stdout, "ID", "AT", "PRINCIPAL", "PROJECT", "ACTION", "TARGET", "RESULT", "DETAIL")
			for _, e := range list {
				t.row(strconv.FormatInt(e.ID, 10), e.At.Local().Format(time.DateTime), e.Principal, e.Project, e.Action,
					orDash(e.Target), e.Result, orDash(e.Detail))
			}
			return t.flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&q.Project, "project", "", "only actions in this project's subtree (default: the token's project)")
	f.StringVar(&q.Action, "action", "", `only this action (sandbox.create), or a prefix ending in "." (sandbox.)`)
	f.IntVar(&q.Limit, "limit", 0, "at most this many entries (default: the server's, 100)")
	f.Int64Var(&q.Before, "before", 0, "only entries older than this entry ID (to page back)")
	return cmd
}
