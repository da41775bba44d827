package runc

import (
	"encoding/json"
	"runtime"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lxcfs"
	"github.com/corral-dev/corral/internal/mountinfo"
	"github.com/corral-dev/corral/internal/seccompbpf"
)

// These tests need neither root nor runc.

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		field string // "" means valid
	}{
		{"defaults", Config{}, ""},
		{"relative state dir", Config{StateDir: "state"}, "StateDir"},
		{"unclean runc root", Config{RuncRoot: "/run/x/../y"}, "RuncRoot"},
		{"root as parent", Config{CgroupParent: "/"}, "CgroupParent"},
		{"runc root inside state", Config{StateDir: "/s", RuncRoot: "/s/runc"}, "RuncRoot"},
		{"state dir too long for the socket", Config{StateDir: "/" + strings.Repeat("a", 94)}, "StateDir"},
		{"longest state dir", Config{StateDir: "/" + strings.Repeat("a", 93)}, ""},
		{"tiny disk", Config{DefaultDiskBytes: 1 << 20}, "DefaultDiskBytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if got := errdefs.Field(err); got != tt.field || (tt.field == "") != (err == nil) {
				t.Errorf("Validate() = %v (field %q), want field %q", err, got, tt.field)
			}
			if err != nil && !errorsIsInvalid(err) {
				t.Errorf("Validate() = %v, want an ErrInvalid", err)
			}
		})
	}
}

func errorsIsInvalid(err error) bool { return errdefs.Code(err) == "invalid" }

func TestSpecNormalize(t *testing.T) {
	dir := t.TempDir()
	base := func() Spec { return resolved(Spec{ID: "sb-1", Lower: []string{dir}, AgentPath: "/agent"}) }
	tests := []struct {
		name  string
		edit  func(*Spec)
		field string // "" with internal: an error that is no ErrInvalid
		check func(*testing.T, Spec)
		// internal: the spec breaks an invariant of the caller (a limit not resolved).
		internal bool
	}{
		{"resolved limits kept", func(*Spec) {}, "", func(t *testing.T, s Spec) {
			if s.Hostname != "sb-1" || s.CPUs != 1 || s.MemoryBytes != 512<<20 || s.Pids != 1024 || s.DiskBytes != 64<<20 ||
				s.OpenFiles != 1000 || s.ShmBytes != testShmBytes {
				t.Errorf("limits changed: %+v", s)
			}
		}, false},
		{"hostname from an underscore ID", func(s *Spec) { s.ID = "a_b." }, "", func(t *testing.T, s Spec) {
			if s.Hostname != "a-b" {
				t.Errorf("hostname %q, want a-b", s.Hostname)
			}
		}, false},
		{"empty ID", func(s *Spec) { s.ID = "" }, "ID", nil, false},
		{"ID with slash", func(s *Spec) { s.ID = "a/b" }, "ID", nil, false},
		{"ID dot-dot", func(s *Spec) { s.ID = ".." }, "ID", nil, false},
		{"ID too long", func(s *Spec) { s.ID = strings.Repeat("a", 65) }, "ID", nil, false},
		{"bad hostname", func(s *Spec) { s.Hostname = "-x" }, "Hostname", nil, false},
		{"no layers", func(s *Spec) { s.Lower = nil }, "Lower", nil, false},
		{"relative layer", func(s *Spec) { s.Lower = []string{"x"} }, "Lower", nil, false},
		{"missing layer", func(s *Spec) { s.Lower = []string{dir + "/nope"} }, "Lower", nil, false},
		{"relative agent", func(s *Spec) { s.AgentPath = "agent" }, "AgentPath", nil, false},
		{"bad env", func(s *Spec) { s.Env = []string{"=x"} }, "Env", nil, false},
		{"too many files for the host", func(s *Spec) { s.OpenFiles = 1001 }, "limits.open_files", nil, false},
		// The runtime defaults nothing: a limit admission did not resolve is refused.
		{"no cpus", func(s *Spec) { s.CPUs = 0 }, "", nil, true},
		{"too many cpus", func(s *Spec) { s.CPUs = 5000 }, "", nil, true},
		{"no memory", func(s *Spec) { s.MemoryBytes = 0 }, "", nil, true},
		{"negative memory", func(s *Spec) { s.MemoryBytes = -1 }, "", nil, true},
		{"tiny memory", func(s *Spec) { s.MemoryBytes = 1 << 20 }, "", nil, true},
		{"no pids", func(s *Spec) { s.Pids = 0 }, "", nil, true},
		{"no disk", func(s *Spec) { s.DiskBytes = 0 }, "", nil, true},
		{"tiny disk", func(s *Spec) { s.DiskBytes = 1 << 20 }, "", nil, true},
		{"no open files", func(s *Spec) { s.OpenFiles = 0 }, "", nil, true},
		{"no shm", func(s *Spec) { s.ShmBytes = 0 }, "", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := base()
			tt.edit(&s)
			err := s.normalize(1000)
			if got := errdefs.Field(err); got != tt.field {
				t.Fatalf("normalize() = %v (field %q), want field %q", err, got, tt.field)
			}
			if tt.internal != (err != nil && !errorsIsInvalid(err)) {
				t.Fatalf("normalize() = %v, want an internal error: %v", err, tt.internal)
			}
			if tt.check != nil {
				tt.check(t, s)
			}
		})
	}
}

// TestRender checks the bundle's security settings as runc will read them.
func TestRender(t *testing.T) {
	tmpl, err := newTemplate(ptr(-1000), false, false)
	if err != nil {
		t.Fatal(err)
	}
	s := resolved(Spec{ID: "x", Lower: []string{t.TempDir()}, AgentPath: "/a", AgentArgs: []string{"serve", "--fd", "3"}, CPUs: 1.5,
		MemoryBytes: 1 << 30, Pids: 99, OpenFiles: 777, Env: []string{"A=b"}})
	if err := s.normalize(1 << 20); err != nil {
		t.Fatal(err)
	}
	b, err := tmpl.render(&s, "/corral/x", nil, nil, nil, Budgets{})
	if err != nil {
		t.Fatal(err)
	}
	var got specs.Spec
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	p, l := got.Process, got.Linux
	if want := []string{"/proc/self/fd/4", "serve", "--fd", "3"}; !slices.Equal(p.Args, want) {
		t.Errorf("args = %v, want %v", p.Args, want)
	}
	if !p.NoNewPrivileges || p.OOMScoreAdj == nil || *p.OOMScoreAdj != -1000 || p.User.UID != 0 {
		t.Errorf("process: nnp %v oom %v uid %d", p.NoNewPrivileges, p.OOMScoreAdj, p.User.UID)
	}
	if len(p.Rlimits) != 1 || p.Rlimits[0].Type != "RLIMIT_NOFILE" || p.Rlimits[0].Hard != 777 || p.Rlimits[0].Soft != 777 {
		t.Errorf("rlimits = %+v", p.Rlimits)
	}
	for _, set := range [][]string{p.Capabilities.Bounding, p.Capabilities.Effective, p.Capabilities.Permitted} {
		for _, c := range []string{"CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_SYS_MODULE", "CAP_NET_RAW", "CAP_SYS_RESOURCE"} {
			if slices.Contains(set, c) {
				t.Errorf("capability %s granted", c)
			}
		}
	}
	if len(p.Capabilities.Inheritable) != 0 || len(p.Capabilities.Ambient) != 0 {
		t.Errorf("inheritable/ambient capabilities: %+v", p.Capabilities)
	}
	if l.Seccomp == nil || l.Seccomp.DefaultAction != specs.ActErrno || len(l.Seccomp.Syscalls) < 10 {
		t.Errorf("seccomp profile missing or not Docker's default")
	}
	if want := []specs.Arch{nativeArch(t)}; !slices.Equal(l.Seccomp.Architectures, want) {
		t.Errorf("seccomp architectures = %v, want %v", l.Seccomp.Architectures, want)
	}
	for _, m := range []string{"/proc/kcore", "/proc/keys", "/proc/kpagecgroup", "/proc/kpagecount", "/proc/kpageflags",
		"/proc/sysrq-trigger", "/proc/timer_list", "/proc/sched_debug", "/proc/acpi", "/proc/scsi", "/sys/firmware",
		"/sys/devices/virtual/powercap"} {
		if !slices.Contains(l.MaskedPaths, m) {
			t.Errorf("%s not masked", m)
		}
	}
	for _, ro := range []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys"} {
		if !slices.Contains(l.ReadonlyPaths, ro) {
			t.Errorf("%s not read-only", ro)
		}
	}
	var ns []specs.LinuxNamespaceType
	for _, n := range l.Namespaces {
		if n.Path != "" {
			t.Errorf("namespace %s joins %s", n.Type, n.Path)
		}
		ns = append(ns, n.Type)
	}
	for _, want := range []specs.LinuxNamespaceType{specs.PIDNamespace, specs.NetworkNamespace, specs.IPCNamespace, specs.UTSNamespace, specs.MountNamespace} {
		if !slices.Contains(ns, want) {
			t.Errorf("no new %s namespace", want)
		}
	}
	for _, m := range got.Mounts {
		if m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind") {
			t.Errorf("bind mount of %s into the sandbox", m.Source)
		}
		if m.Destination == "/sys" && !slices.Contains(m.Options, "ro") {
			t.Errorf("/sys is writable")
		}
		if m.Destination == "/dev/shm" && !slices.Contains(m.Options, "size=67108864") {
			t.Errorf("/dev/shm options %v", m.Options)
		}
	}
	r := l.Resources
	if *r.Memory.Limit != 1<<30 || *r.Memory.Swap != 1<<30 || *r.Pids.Limit != 99 || *r.CPU.Quota != 150000 || *r.CPU.Period != 100000 {
		t.Errorf("resources = mem %d swap %d pids %d quota %d", *r.Memory.Limit, *r.Memory.Swap, *r.Pids.Limit, *r.CPU.Quota)
	}
	if l.CgroupsPath != "/corral/x" || got.Hostname != "x" || got.Root.Path != "rootfs" || got.Root.Readonly {
		t.Errorf("cgroups %q hostname %q root %+v", l.CgroupsPath, got.Hostname, got.Root)
	}
	if !slices.Equal(p.Env, []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "A=b"}) {
		t.Errorf("env = %v", p.Env)
	}
}

func nativeArch(t *testing.T) specs.Arch {
	switch runtime.GOARCH {
	case "amd64":
		return specs.ArchX86_64
	case "arm64":
		return specs.ArchAARCH64
	}
	t.Skipf("no expectation for %s", runtime.GOARCH)
	return ""
}

func TestSeccompAllArches(t *testing.T) {
	tmpl, err := newTemplate(nil, true, true)
	if err != nil {
		t.Fatal(err)
	}
	var sc specs.LinuxSeccomp
	if err := json.Unmarshal(tmpl.seccomp, &sc); err != nil {
		t.Fatal(err)
	}
	if runtime.GOARCH == "amd64" && !slices.Equal(sc.Architectures, []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32}) {
		t.Errorf("architectures = %v, want Docker's three", sc.Architectures)
	}
	if runtime.GOARCH == "amd64" && tmpl.seccompBPF != "" {
		t.Errorf("a profile of three architectures was compiled in process; it is runc's to compile")
	}
}

// TestRenderCompiledSeccomp checks where a sandbox's seccomp profile goes: compiled, to the
// agent's environment and not into config.json (an ordinary sandbox and one that runs calls,
// each its own profile); as a profile for runc with SeccompInRunc and on gVisor. Never both,
// never neither.
func TestRenderCompiledSeccomp(t *testing.T) {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		t.Skip("no compiled profiles on " + runtime.GOARCH)
	}
	compiled, err := newTemplate(nil, false, true)
	if err != nil {
		t.Fatal(err)
	}
	inRunc, err := newTemplate(nil, false, false)
	if err != nil {
		t.Fatal(err)
	}
	if compiled.seccompBPF == "" || compiled.callsSeccompBPF == "" || compiled.seccompBPF == compiled.callsSeccompBPF {
		t.Fatalf("compiled profiles: %d and %d bytes, equal %v", len(compiled.seccompBPF), len(compiled.callsSeccompBPF), compiled.seccompBPF == compiled.callsSeccompBPF)
	}
	for _, c := range []struct {
		name    string
		tmpl    *template
		calls   bool
		gvisor  bool
		wantBPF string // "" for a profile in config.json
		profile json.RawMessage
	}{
		{"compiled", compiled, false, false, compiled.seccompBPF, nil},
		{"compiled calls", compiled, true, false, compiled.callsSeccompBPF, nil},
		{"compiled on gVisor", compiled, false, true, "", compiled.seccomp},
		{"in runc", inRunc, false, false, "", inRunc.seccomp},
		{"in runc, calls", inRunc, true, false, "", inRunc.callsSeccomp},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := resolved(Spec{ID: "x", Lower: []string{t.TempDir()}, AgentPath: "/a", AgentArgs: []string{"serve"}, Calls: c.calls, Env: []string{"A=b"}})
			var gv *gvisorPaths
			if c.gvisor {
				s.Runtime = string(EngineGVisor)
				gv = &gvisorPaths{agentBin: "/a"}
			}
			if err := s.normalize(1 << 20); err != nil {
				t.Fatal(err)
			}
			b, err := c.tmpl.render(&s, "/corral/x", gv, nil, nil, Budgets{})
			if err != nil {
				t.Fatal(err)
			}
			var spec specs.Spec
			if err := json.Unmarshal(b, &spec); err != nil {
				t.Fatal(err)
			}
			var env []string
			for _, e := range spec.Process.Env {
				if v, ok := strings.CutPrefix(e, seccompbpf.EnvVar+"="); ok {
					env = append(env, v)
				}
			}
			if c.wantBPF != "" {
				if spec.Linux.Seccomp != nil || len(env) != 1 || env[0] != c.wantBPF {
					t.Fatalf("config.json has a profile (%v) or the agent's environment lacks the program (%d of it)", spec.Linux.Seccomp != nil, len(env))
				}
				if !spec.Process.NoNewPrivileges {
					t.Error("no_new_privs off: the agent could not install its filter unprivileged")
				}
				return
			}
			if len(env) != 0 || spec.Linux.Seccomp == nil {
				t.Fatalf("want the profile in config.json and no program: profile %v, program %d", spec.Linux.Seccomp != nil, len(env))
			}
			want, _ := json.Marshal(spec.Linux.Seccomp)
			var w specs.LinuxSeccomp
			json.Unmarshal(c.profile, &w)
			wb, _ := json.Marshal(&w)
			if string(want) != string(wb) {
				t.Errorf("config.json's profile is not the template's")
			}
		})
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{
		`/a/b`:           "/a/b",
		`/a\040b`:        "/a b",
		`/tab\011x\134y`: "/tab\tx\\y",
		`/trailing\04`:   `/trailing\04`,
		`/not\999octal`:  `/not\999octal`,
		`/nl\012`:        "/nl\n",
	} {
		if got := mountinfo.Unescape(in); got != want {
			t.Errorf("mountinfo.Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestRenderCalls checks the bundle of a sandbox that runs calls: the agent gets CAP_SYS_ADMIN,
// a profile that lets it mount and pivot, and --calls; nothing else changes, and an ordinary
// sandbox of the same template has none of it.
func TestRenderCalls(t *testing.T) {
	tmpl, err := newTemplate(nil, true, false)
	if err != nil {
		t.Fatal(err)
	}
	render := func(calls bool, args ...string) specs.Spec {
		t.Helper()
		s := resolved(Spec{ID: "x", Lower: []string{t.TempDir()}, AgentPath: "/a", AgentArgs: args, Calls: calls})
		if err := s.normalize(1 << 20); err != nil {
			t.Fatal(err)
		}
		b, err := tmpl.render(&s, "/corral/x", nil, nil, nil, Budgets{})
		if err != nil {
			t.Fatal(err)
		}
		var got specs.Spec
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	allowed := func(sc *specs.LinuxSeccomp, name string) bool {
		for _, r := range sc.Syscalls {
			if r.Action == specs.ActAllow && len(r.Args) == 0 && slices.Contains(r.Names, name) {
				return true
			}
		}
		return false
	}
	plain := render(false, "serve")
	if !slices.Equal(plain.Process.Capabilities.Bounding, agentrpc.SandboxCaps()) {
		t.Errorf("ordinary sandbox caps = %v, want agentrpc.SandboxCaps()", plain.Process.Capabilities.Bounding)
	}
	for _, sys := range []string{"mount", "umount2", "unshare", "pivot_root", "setns"} {
		if allowed(plain.Linux.Seccomp, sys) {
			t.Errorf("ordinary sandbox's profile allows %s", sys)
		}
	}
	if len(plain.Linux.Seccomp.Architectures) < 2 {
		t.Errorf("SeccompAllArches template lost its sub-architectures: %v", plain.Linux.Seccomp.Architectures)
	}

	calls := render(true, "serve", "--fd", "3")
	if want := []string{"/proc/self/fd/4", "serve", "--fd", "3", "--calls"}; !slices.Equal(calls.Process.Args, want) {
		t.Errorf("args = %v, want %v", calls.Process.Args, want)
	}
	if got := render(true, "serve", "--calls").Process.Args; !slices.Equal(got, []string{"/proc/self/fd/4", "serve", "--calls"}) {
		t.Errorf("args with --calls given = %v", got)
	}
	want := append(agentrpc.SandboxCaps(), "CAP_SYS_ADMIN")
	c := calls.Process.Capabilities
	for _, set := range [][]string{c.Bounding, c.Effective, c.Permitted} {
		if !slices.Equal(set, want) {
			t.Errorf("calls sandbox caps = %v, want %v", set, want)
		}
	}
	if len(c.Inheritable) != 0 || len(c.Ambient) != 0 || !calls.Process.NoNewPrivileges {
		t.Errorf("calls sandbox: inheritable %v ambient %v nnp %v", c.Inheritable, c.Ambient, calls.Process.NoNewPrivileges)
	}
	for _, sys := range []string{"mount", "umount2", "unshare", "pivot_root"} {
		if !allowed(calls.Linux.Seccomp, sys) {
			t.Errorf("calls sandbox's profile does not allow %s", sys)
		}
	}
	if want := []specs.Arch{nativeArch(t)}; !slices.Equal(calls.Linux.Seccomp.Architectures, want) {
		t.Errorf("calls sandbox's seccomp architectures = %v, want %v", calls.Linux.Seccomp.Architectures, want)
	}
	if !slices.Equal(calls.Linux.MaskedPaths, plain.Linux.MaskedPaths) || !slices.Equal(calls.Linux.ReadonlyPaths, plain.Linux.ReadonlyPaths) {
		t.Errorf("calls sandbox's masked or read-only paths differ")
	}

	s := resolved(Spec{ID: "x", Lower: []string{t.TempDir()}, AgentPath: "/a", Calls: true, Runtime: string(EngineGVisor)})
	if err := s.normalize(1 << 20); errdefs.Field(err) != "Calls" {
		t.Errorf("Calls on gVisor: %v, want invalid Calls", err)
	}
}

// TestRenderHostFacts checks the host facts: masked without LXCFS, LXCFS's files bound with it
// (plain binds, not masked under them), rootfs propagation rslave either way.
func TestRenderHostFacts(t *testing.T) {
	tmpl, err := newTemplate(nil, false, false)
	if err != nil {
		t.Fatal(err)
	}
	s := resolved(Spec{ID: "x", Lower: []string{t.TempDir()}, AgentPath: "/a"})
	if err := s.normalize(1 << 20); err != nil {
		t.Fatal(err)
	}
	facts := []lxcfs.Bind{{Source: "/d/lxcfs/view/meminfo", Target: "/proc/meminfo"}, {Source: "/d/lxcfs/view/swaps", Target: "/proc/swaps"}}
	for _, with := range []bool{false, true} {
		var f []lxcfs.Bind
		if with {
			f = facts
		}
		b, err := tmpl.render(&s, "/corral/x", nil, f, nil, Budgets{})
		if err != nil {
			t.Fatal(err)
		}
		var got specs.Spec
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if got.Linux.RootfsPropagation != "rslave" {
			t.Errorf("rootfs propagation %q, want rslave (LXCFS restarts reach sandboxes through it)", got.Linux.RootfsPropagation)
		}
		for _, m := range []string{"/proc/cmdline", "/proc/partitions", "/proc/slabinfo", "/sys/kernel/vmcoreinfo", "/sys/block", "/sys/class/block"} {
			if !slices.Contains(got.Linux.MaskedPaths, m) {
				t.Errorf("lxcfs %v: %s not masked", with, m)
			}
		}
		if masked := slices.Contains(got.Linux.MaskedPaths, "/proc/swaps"); masked == with {
			t.Errorf("lxcfs %v: /proc/swaps masked %v", with, masked)
		}
		var binds int
		for _, m := range got.Mounts {
			for _, fb := range facts {
				if m.Destination == fb.Target {
					binds++
					// Flags and propagation come from the host's mount (e2e TestRedTeamHostFacts
					// checks them inside a sandbox).
					if !with || m.Source != fb.Source || !slices.Equal(m.Options, []string{"bind"}) {
						t.Errorf("lxcfs %v: mount %+v", with, m)
					}
				}
			}
		}
		if with && binds != len(facts) {
			t.Errorf("%d LXCFS binds, want %d", binds, len(facts))
		}
	}
}
