package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/iam"
	corral "github.com/corral-dev/corral/sdk/go"
	"github.com/corral-dev/corral/sdk/go/corraltest"
)

// mustCLI runs the CLI and fails the test unless it exits 0.
func mustCLI(t *testing.T, srv *corraltest.Server, env map[string]string, args ...string) result {
	t.Helper()
	got := cli(t, srv, nil, env, args...)
	if got.code != 0 {
		t.Fatalf("corral %s: exit %d, stderr %q", strings.Join(args, " "), got.code, got.stderr)
	}
	return got
}

// decode unmarshals a command's JSON output into v.
func decode(t *testing.T, got result, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(got.stdout), v); err != nil {
		t.Fatalf("output is not the JSON wanted (%v):\n%s", err, got.stdout)
	}
}

// usageRefused checks that args is a usage error mentioning stderrSub that sent nothing.
func usageRefused(t *testing.T, srv *corraltest.Server, stderrSub string, args ...string) {
	t.Helper()
	before := len(srv.RequestLines())
	got := cli(t, srv, nil, nil, args...)
	checkResult(t, got, 2, "", stderrSub)
	if after := srv.RequestLines(); len(after) != before {
		t.Errorf("corral %s: a usage error sent %v", strings.Join(args, " "), after[before:])
	}
}

func TestWhoami(t *testing.T) {
	srv := corraltest.NewServer(t)
	got := mustCLI(t, srv, nil, "whoami")
	for _, want := range []string{"Principal:    admin\n", "Kind:         user\n", "Project:      /\n", "Role:         owner\n",
		"Permissions:  sandbox.read, "} {
		if !strings.Contains(got.stdout, want) {
			t.Errorf("whoami lacks %q:\n%s", want, got.stdout)
		}
	}
	var me corral.Whoami
	decode(t, mustCLI(t, srv, nil, "whoami", "-o", "json"), &me)
	if me.Principal.Name != "admin" || me.Token.Project != corral.RootProject || !slices.Contains(me.Permissions, corral.PermProjectGrant) {
		t.Errorf("whoami -o json = %+v", me)
	}
}

func TestProjects(t *testing.T) {
	srv := corraltest.NewServer(t)
	checkResult(t, mustCLI(t, srv, nil, "project", "create", "team-a"), 0, "team-a\n", "")
	var p corral.Project
	decode(t, mustCLI(t, srv, nil, "project", "create", "team-a/rollout-17", "-o", "json"), &p)
	if p.Path != "team-a/rollout-17" || p.Parent != "team-a" || p.ID == "" {
		t.Errorf("project create -o json = %+v", p)
	}
	mustCLI(t, srv, nil, "project", "create", "team-b")
	checkResult(t, cli(t, srv, nil, nil, "project", "create", "team-c/x"), 1, "", "corral: project team-c not found")
	checkResult(t, cli(t, srv, nil, nil, "project", "create", "team-a"), 1, "", "corral: project team-a already exists")

	// A sandbox created in a project shows it, and ls filters by it.
	got := mustCLI(t, srv, nil, "create", "--project", "team-a/rollout-17")
	if r := lastRequest(t, srv); strings.TrimSpace(string(r.Body)) != `{"base":"base:default","project":"team-a/rollout-17"}` {
		t.Errorf("create --project sent %s", r.Body)
	}
	id := strings.TrimSpace(got.stdout)
	if sb, _ := srv.Sandbox(id); sb.Project != "team-a/rollout-17" {
		t.Errorf("sandbox project = %q", sb.Project)
	}
	mustCreate(t, srv) // in the root project
	got = mustCLI(t, srv, nil, "ls", "--project", "team-a")
	if r := lastRequest(t, srv); r.String() != "GET /v1/sandboxes?project=team-a" {
		t.Errorf("ls --project sent %s", r)
	}
	lines := strings.Split(strings.TrimSpace(got.stdout), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], " PROJECT ") || !strings.Contains(lines[1], " team-a/rollout-17 ") {
		t.Errorf("ls --project table:\n%s", got.stdout)
	}
	if got := mustCLI(t, srv, nil, "get", id); !strings.Contains(got.stdout, "Project:        team-a/rollout-17\n") {
		t.Errorf("get lacks the project:\n%s", got.stdout)
	}

	got = mustCLI(t, srv, nil, "project", "ls")
	if !strings.HasPrefix(got.stdout, "PATH               SANDBOXES  ID") || !strings.Contains(got.stdout, "\nteam-a/rollout-17  1          prj-") {
		t.Errorf("project ls table:\n%s", got.stdout)
	}
	var list []corral.Project
	decode(t, mustCLI(t, srv, nil, "project", "ls", "--under", "team-a", "-o", "json"), &list)
	if len(list) != 2 || list[0].Path != "team-a" || list[1].Path != "team-a/rollout-17" {
		t.Errorf("project ls --under team-a -o json = %+v", list)
	}

	got = mustCLI(t, srv, nil, "project", "tree")
	wantTree := "PROJECT         SANDBOXES\n" +
		"/               1\n" +
		"  team-a        0\n" +
		"    rollout-17  1\n" +
		"  team-b        0\n"
	if got.stdout != wantTree {
		t.Errorf("project tree:\n%s\nwant:\n%s", got.stdout, wantTree)
	}
	var tree projectNode
	decode(t, mustCLI(t, srv, nil, "project", "tree", "--under", "team-a", "-o", "json"), &tree)
	if tree.Path != "team-a" || len(tree.Children) != 1 || tree.Children[0].Path != "team-a/rollout-17" ||
		tree.Children[0].Sandboxes != 1 || tree.Children[0].Children == nil || tree.Children[0].ID == "" {
		t.Errorf("project tree --under team-a -o json = %+v", tree)
	}
	if !strings.Contains(mustCLI(t, srv, nil, "project", "tree", "-o", "json").stdout, `"children": []`) {
		t.Errorf("a leaf of project tree -o json lacks an empty children list")
	}

	// Moving and deleting a subtree with a live sandbox needs --force.
	checkResult(t, cli(t, srv, nil, nil, "project", "mv", "team-a/rollout-17", "team-b/rollout-17"), 1, "", "live sandboxes")
	checkResult(t, cli(t, srv, nil, nil, "project", "mv", "team-a/rollout-17", "team-b/rollout-17", "--force"), 0, "team-b/rollout-17\n", "")
	if sb, _ := srv.Sandbox(id); sb.Project != "team-b/rollout-17" {
		t.Errorf("after mv, the sandbox is in %q", sb.Project)
	}
	checkResult(t, cli(t, srv, nil, nil, "project", "rm", "team-b"), 1, "", "live sandboxes")
	checkResult(t, cli(t, srv, nil, nil, "project", "rm", "team-b", "--force"), 0, "", "")
	if r := lastRequest(t, srv); r.String() != "DELETE /v1/projects/team-b?force=true" {
		t.Errorf("project rm --force sent %s", r)
	}
	if sb, _ := srv.Sandbox(id); sb.State != corral.StateStopped {
		t.Errorf("after rm --force, the sandbox is %s", sb.State)
	}
	checkResult(t, cli(t, srv, nil, nil, "project", "rm", "team-b"), 1, "", "corral: project team-b not found")
	usageRefused(t, srv, "project mv wants FROM and TO", "project", "mv", "team-a")
}

func TestGrantsAndPrincipals(t *testing.T) {
	srv := corraltest.NewServer(t)
	mustCLI(t, srv, nil, "project", "create", "team-a")
	checkResult(t, cli(t, srv, nil, nil, "principal", "create", "alice"), 0, "alice\n", "")
	var p corral.Principal
	decode(t, mustCLI(t, srv, nil, "principal", "create", "ci", "--kind", "service", "--project", "team-a", "-o", "json"), &p)
	if p.Name != "ci" || p.Kind != corral.KindService || p.Project != "team-a" || p.CreatedBy != "admin" {
		t.Errorf("principal create -o json = %+v", p)
	}
	usageRefused(t, srv, `--kind "robot": want user, service or agent`, "principal", "create", "r2", "--kind", "robot")
	checkResult(t, cli(t, srv, nil, nil, "principal", "create", "alice"), 1, "", "already exists")

	var ps []corral.Principal
	decode(t, mustCLI(t, srv, nil, "principal", "ls", "--project", "team-a", "-o", "json"), &ps)
	if len(ps) != 1 || ps[0].Name != "ci" {
		t.Errorf("principal ls --project team-a = %+v", ps)
	}
	if got := mustCLI(t, srv, nil, "principal", "ls"); !strings.HasPrefix(got.stdout, "NAME   KIND     PROJECT") || !strings.Contains(got.stdout, "\nci     service  team-a") {
		t.Errorf("principal ls table:\n%s", got.stdout)
	}

	checkResult(t, cli(t, srv, nil, nil, "grant", "team-a", "alice", "user"), 0, "alice: user on team-a\n", "")
	if r := lastRequest(t, srv); strings.TrimSpace(string(r.Body)) != `{"project":"team-a","principal":"alice","role":"user"}` {
		t.Errorf("grant sent %s", r.Body)
	}
	var g corral.Grant
	decode(t, mustCLI(t, srv, nil, "grant", "team-a", "ci", "viewer", "-o", "json"), &g)
	if g.Role != corral.RoleViewer || g.Principal != "ci" {
		t.Errorf("grant -o json = %+v", g)
	}
	usageRefused(t, srv, `role "superuser": want viewer, user, admin or owner`, "grant", "team-a", "alice", "superuser")
	usageRefused(t, srv, "grant wants a project PATH, a PRINCIPAL and a ROLE", "grant", "team-a", "alice")
	checkResult(t, cli(t, srv, nil, nil, "grant", "team-a", "bob", "user"), 1, "", "principal bob not found")

	got := mustCLI(t, srv, nil, "grants", "--project", "team-a")
	if !strings.HasPrefix(got.stdout, "PROJECT  PRINCIPAL  ROLE") || strings.Count(got.stdout, "\n") != 3 {
		t.Errorf("grants table:\n%s", got.stdout)
	}

	checkResult(t, cli(t, srv, nil, nil, "revoke", "team-a", "alice", "user"), 0, "", "")
	if r := lastRequest(t, srv); r.String() != "DELETE /v1/grants?principal=alice&project=team-a&role=user" {
		t.Errorf("revoke sent %s", r)
	}
	checkResult(t, cli(t, srv, nil, nil, "revoke", "team-a", "ci"), 0, "", "")
	if r := lastRequest(t, srv); r.String() != "DELETE /v1/grants?principal=ci&project=team-a" {
		t.Errorf("revoke without a role sent %s", r)
	}
	checkResult(t, cli(t, srv, nil, nil, "revoke", "team-a", "alice"), 1, "", "no grant")
	usageRefused(t, srv, "want viewer, user, admin or owner", "revoke", "team-a", "alice", "boss")
	usageRefused(t, srv, "revoke wants a project PATH, a PRINCIPAL and optionally a ROLE", "revoke", "team-a")
}

func TestQuota(t *testing.T) {
	srv := corraltest.NewServer(t)
	mustCLI(t, srv, nil, "project", "create", "team-a")
	mustCLI(t, srv, nil, "project", "create", "team-a/sub")

	// Each set reads the limits, changes the ones given, and puts all of them back.
	for _, step := range []struct {
		args []string
		body string
	}{
		{[]string{"--sandboxes", "1", "--memory", "2G", "--tier", "container=3"}, `{"sandboxes":1,"memory_bytes":2147483648,"tiers":{"container":3}}`},
		{[]string{"--memory", "none", "--cpus", "1.5", "--creates-per-minute", "10"}, `{"sandboxes":1,"cpus":1.5,"creates_per_minute":10,"tiers":{"container":3}}`},
		{[]string{"--tier", "container=none", "--disk", "10GB", "--cpus", "none"}, `{"sandboxes":1,"disk_bytes":10000000000,"creates_per_minute":10}`},
		{[]string{"--artifact-bytes", "1M"}, `{"sandboxes":1,"disk_bytes":10000000000,"creates_per_minute":10,"artifact_bytes":1048576}`},
		{[]string{"--artifact-bytes", "none"}, `{"sandboxes":1,"disk_bytes":10000000000,"creates_per_minute":10}`},
	} {
		before := len(srv.Requests())
		got := mustCLI(t, srv, nil, append([]string{"quota", "set", "team-a", "-o", "json"}, step.args...)...)
		reqs := srv.Requests()[before:]
		if len(reqs) != 2 || reqs[0].String() != "GET /v1/quotas/team-a" || reqs[1].String() != "PUT /v1/quotas/team-a" {
			t.Fatalf("quota set %v sent %v", step.args, reqs)
		}
		if b := strings.TrimSpace(string(reqs[1].Body)); b != step.body {
			t.Errorf("quota set %v put %s, want %s", step.args, b, step.body)
		}
		var q corral.ProjectQuota
		decode(t, got, &q)
		if q.Project != "team-a" || q.Limit.Sandboxes == nil || *q.Limit.Sandboxes != 1 {
			t.Errorf("quota set -o json = %+v", q)
		}
	}
	mustCLI(t, srv, nil, "quota", "set", "team-a/sub", "--sandboxes", "1")

	got := mustCLI(t, srv, nil, "quota", "show", "team-a")
	want := "RESOURCE            LIMIT   USAGE  DELEGATED\n" +
		"sandboxes           1       0      1\n" +
		"cpus                -       0      -\n" +
		"memory              -       0      -\n" +
		"disk                9.3GiB  0      -\n" +
		"creates-per-minute  10      0      -\n"
	if got.stdout != want {
		t.Errorf("quota show:\n%s\nwant:\n%s", got.stdout, want)
	}

	// A refusal by a quota names it.
	mustCLI(t, srv, nil, "create", "--project", "team-a/sub")
	checkResult(t, cli(t, srv, nil, nil, "create", "--project", "team-a"), 1, "",
		"corral: quota exceeded: project team-a: sandboxes limit 1, in use 1, requested 1\n")
	mustCLI(t, srv, nil, "quota", "set", "/", "--memory", "1G")
	checkResult(t, cli(t, srv, nil, nil, "create", "--memory", "2G"), 1, "",
		"corral: quota exceeded: project /: memory_bytes limit 1GiB, in use 0, requested 2GiB\n")

	usageRefused(t, srv, "say which limits to change", "quota", "set", "team-a")
	usageRefused(t, srv, `"12X" is not a size`, "quota", "set", "team-a", "--memory", "12X")
	usageRefused(t, srv, `--sandboxes "-1": want a whole number or none`, "quota", "set", "team-a", "--sandboxes", "-1")
	usageRefused(t, srv, `--cpus "lots"`, "quota", "set", "team-a", "--cpus", "lots")
	usageRefused(t, srv, `--tier "gpu": want NAME=N`, "quota", "set", "team-a", "--tier", "gpu")
	checkResult(t, cli(t, srv, nil, nil, "quota", "show", "nope"), 1, "", "corral: project nope not found")
}

func TestTokens(t *testing.T) {
	srv := corraltest.NewServer(t)
	mustCLI(t, srv, nil, "project", "create", "team-a")
	for _, tt := range []struct {
		stderr string
		args   []string
	}{
		{`required flag(s) "project" not set`, []string{"--role", "user"}},
		{"[role permission] is required", []string{"--project", "team-a"}},
		{`--role "god": want viewer, user, admin or owner`, []string{"--project", "team-a", "--role", "god"}},
		{`--permission "sandbox.everything"`, []string{"--project", "team-a", "--permission", "sandbox.everything"}},
		{"none of the others can be", []string{"--project", "team-a", "--role", "user", "--permission", "sandbox.read"}},
		{`--ttl "soon"`, []string{"--project", "team-a", "--role", "user", "--ttl", "soon"}},
		{`--kind "robot"`, []string{"--project", "team-a", "--role", "user", "--kind", "robot"}},
		{"none of the others can be", []string{"--project", "team-a", "--role", "user", "--principal", "admin", "--name", "x"}},
	} {
		usageRefused(t, srv, tt.stderr, append([]string{"token", "create"}, tt.args...)...)
	}

	// The secret alone on stdout, so TOK=$(corral token create ...) works.
	got := mustCLI(t, srv, nil, "token", "create", "--project", "team-a", "--role", "user", "--kind", "agent", "--name", "bot", "--ttl", "1h")
	secret := strings.TrimSuffix(got.stdout, "\n")
	if secret == "" || strings.ContainsAny(secret, " \n") || !strings.Contains(got.stderr, "shown only this once") {
		t.Fatalf("token create printed stdout %q, stderr %q", got.stdout, got.stderr)
	}
	if b := strings.TrimSpace(string(lastRequest(t, srv).Body)); b != `{"project":"team-a","role":"user","ttl":"1h","kind":"agent","name":"bot"}` {
		t.Errorf("token create sent %s", b)
	}

	// The minted token works, within its project and permissions only.
	bot := map[string]string{"CORRAL_TOKEN": secret}
	var me corral.Whoami
	decode(t, mustCLI(t, srv, bot, "whoami", "-o", "json"), &me)
	if me.Principal.Name != "bot" || me.Principal.Kind != corral.KindAgent || me.Token.Project != "team-a" || me.Token.Role != corral.RoleUser {
		t.Errorf("whoami as the minted token = %+v", me)
	}
	id := strings.TrimSpace(mustCLI(t, srv, bot, "create").stdout)
	if sb, _ := srv.Sandbox(id); sb.Project != "team-a" {
		t.Errorf("a sandbox created by a team-a token is in %q", sb.Project)
	}
	checkResult(t, cli(t, srv, nil, bot, "project", "create", "team-a/sub"), 1, "", "corral: permission project.create on project team-a is missing\n")
	checkResult(t, cli(t, srv, nil, bot, "create", "--project", "/"), 1, "", "(missing permission sandbox.create)\n")

	// A token minted from the minted one, with fewer permissions; JSON carries the secret.
	var child corral.Token
	decode(t, mustCLI(t, srv, bot, "token", "create", "--project", "team-a", "--permission", "sandbox.read", "-o", "json"), &child)
	if child.Token == "" || child.Principal != "bot" || child.Parent != me.Token.ID || !slices.Equal(child.Permissions, []string{"sandbox.read"}) {
		t.Errorf("token create -o json = %+v", child)
	}
	checkResult(t, cli(t, srv, nil, bot, "token", "create", "--project", "team-a", "--role", "admin"), 1, "", "permission")

	got = mustCLI(t, srv, nil, "token", "ls")
	if !strings.HasPrefix(got.stdout, "ID         PRINCIPAL  PROJECT  ACCESS") || !strings.Contains(got.stdout, me.Token.ID+"      bot        team-a   role user") {
		t.Errorf("token ls table:\n%s", got.stdout)
	}

	// Revoking a token revokes the ones minted from it.
	checkResult(t, cli(t, srv, nil, nil, "token", "revoke", me.Token.ID), 0, me.Token.ID+"\n", "")
	checkResult(t, cli(t, srv, nil, bot, "whoami"), 1, "", "missing or wrong bearer token")
	checkResult(t, cli(t, srv, nil, map[string]string{"CORRAL_TOKEN": child.Token}, "whoami"), 1, "", "missing or wrong bearer token")
	var tokens []corral.Token
	decode(t, mustCLI(t, srv, nil, "token", "ls", "-o", "json"), &tokens)
	if len(tokens) != 3 || tokens[1].RevokedAt == nil || tokens[2].RevokedAt == nil || tokens[0].RevokedAt != nil {
		t.Errorf("token ls -o json after revoke = %+v", tokens)
	}
	if got := mustCLI(t, srv, nil, "token", "ls"); strings.Count(got.stdout, " revoked ") != 2 {
		t.Errorf("token ls does not show two revoked tokens:\n%s", got.stdout)
	}
	checkResult(t, cli(t, srv, nil, nil, "token", "revoke", "tok-404"), 1, "", "token tok-404 not found")
}

func TestAudit(t *testing.T) {
	srv := corraltest.NewServer(t)
	mustCLI(t, srv, nil, "project", "create", "team-a")
	mustCLI(t, srv, nil, "create", "--project", "team-a")
	mustCLI(t, srv, nil, "project", "create", "team-b")

	var entries []corral.AuditEntry
	decode(t, mustCLI(t, srv, nil, "audit", "-o", "json"), &entries)
	var actions []string
	for _, e := range entries {
		actions = append(actions, e.Action+" "+e.Target)
	}
	if want := []string{"project.create team-b", "sandbox.create sb-1", "project.create team-a"}; !reflect.DeepEqual(actions, want) {
		t.Errorf("audit -o json actions = %q, want %q", actions, want)
	}

	got := mustCLI(t, srv, nil, "audit", "--project", "team-a", "--action", "sandbox.", "--limit", "5")
	if r := lastRequest(t, srv); r.String() != "GET /v1/audit?action=sandbox.&limit=5&project=team-a" {
		t.Errorf("audit sent %s", r)
	}
	lines := strings.Split(strings.TrimSpace(got.stdout), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "ID  AT ") || !strings.Contains(lines[1], "admin      team-a   sandbox.create  sb-1    ok") {
		t.Errorf("audit table:\n%s", got.stdout)
	}
	usageRefused(t, srv, "--limit and --before must not be negative", "audit", "--limit", "-1")
}

func TestProjectFlags(t *testing.T) {
	srv := corraltest.NewServer(t)
	dir := t.TempDir()
	var tarball strings.Builder
	if err := writeTree(t.Context(), dir, &tarball); err != nil {
		t.Fatal(err)
	}
	tarFile := filepath.Join(dir, "layer.tar")
	os.WriteFile(tarFile, []byte(tarball.String()), 0o644)

	mustCLI(t, srv, nil, "layer", "import", "tools:1", "--kind", "toolkit", "--tar", tarFile, "--project", "team-a", "--private")
	if r := lastRequest(t, srv); r.String() != "POST /v1/layers?kind=toolkit&name=tools&private=true&project=team-a&version=1" {
		t.Errorf("layer import --project --private sent %s", r)
	}
	mustCLI(t, srv, nil, "layer", "import", "tools:2", "--kind", "toolkit", "--dir", dir, "--project", "team-a")
	if r := lastRequest(t, srv); r.String() != "POST /v1/layers?kind=toolkit&name=tools&project=team-a&version=2" {
		t.Errorf("layer import --dir --project sent %s", r)
	}

	// The fake has no fncall routes: only the request is checked.
	cli(t, srv, nil, nil, "fncall", "create", "judge", "--base", "base:default", "--project", "team-a")
	if r := lastRequest(t, srv); !strings.Contains(string(r.Body), `"name":"judge","project":"team-a"`) {
		t.Errorf("fncall create --project sent %s", r.Body)
	}

	got := mustCLI(t, srv, nil, "--help")
	for _, c := range []string{"whoami", "project", "grant", "grants", "revoke", "principal", "quota", "token", "audit"} {
		if !strings.Contains(got.stdout, "\n  "+c+" ") {
			t.Errorf("help lacks command %s", c)
		}
	}
}

// TestTokenE2BKey: `corral token e2b-key` prints a token's E2B alias, of the given token or of the
// one the CLI would use, without asking the server.
func TestTokenE2BKey(t *testing.T) {
	srv := corraltest.NewServer(t)
	secret, _ := iam.NewToken()
	want, err := iam.E2BKey(secret)
	if err != nil {
		t.Fatal(err)
	}
	if got := mustCLI(t, srv, nil, "token", "e2b-key", secret).stdout; got != want+"\n" {
		t.Errorf("token e2b-key TOKEN = %q, want %q", got, want)
	}
	if got := mustCLI(t, srv, map[string]string{"CORRAL_TOKEN": secret}, "token", "e2b-key").stdout; got != want+"\n" {
		t.Errorf("token e2b-key with CORRAL_TOKEN = %q, want %q", got, want)
	}
	if !regexp.MustCompile(`^e2b_[0-9a-f]+$`).MatchString(want) {
		t.Errorf("alias %q does not have E2B's key shape", want)
	}
	usageRefused(t, srv, "not a Corral token", "token", "e2b-key", "ct_123")
}
