package runc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lazyregexp"
	"github.com/corral-dev/corral/internal/lxcfs"
	"github.com/corral-dev/corral/internal/rlimitenv"
	"github.com/corral-dev/corral/internal/runtime"
	"github.com/corral-dev/corral/internal/seccompbpf"
)

// Spec is runtime.Spec as runc reads it: Create converts the neutral Spec to it, and its
// methods apply runc's own rules. runc uses Lower (not Images) and refuses BootDisk; Runtime is
// EngineRunc (also when empty) or EngineGVisor; Calls is runc only.
type Spec runtime.Spec

// engine is the OCI runtime that runs the sandbox.
func (s *Spec) engine() Engine { return Engine(s.Runtime) }

// The agent binary's descriptor and the path runc execs it by.
const (
	agentSocketFD = 3
	agentExecFD   = 4
	agentExecPath = "/proc/self/fd/4"
)

var idRE = lazyregexp.New(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

func validID(id string) bool { return idRE.MatchString(id) }

var hostnameRE = lazyregexp.New(`^[A-Za-z0-9]([A-Za-z0-9.-]{0,61}[A-Za-z0-9])?$`)

// normalize validates s and fills what runc derives from it (Engine, Hostname). It defaults no
// limit: they come resolved (internal/limits).
func (s *Spec) normalize(maxOpenFiles uint64) error {
	if !validID(s.ID) {
		return errdefs.Invalid("ID", "%q: want 1-64 of [A-Za-z0-9_.-], starting with a letter or digit", s.ID)
	}
	switch s.engine() {
	case "":
		s.Runtime = string(EngineRunc)
	case EngineRunc, EngineGVisor:
	default:
		return errdefs.Invalid("Runtime", "%q: want %q or %q", s.Runtime, EngineRunc, EngineGVisor)
	}
	if s.BootDisk != "" {
		return errdefs.Invalid("BootDisk", "%s runs containers, not machines booted from a disk", s.engine())
	}
	if s.Calls && s.engine() != EngineRunc {
		return errdefs.Invalid("Calls", "calls run on runc only, not on %s", s.engine())
	}
	if s.Fork != nil {
		if filesOf(s.Fork) == nil {
			return errdefs.Invalid("Fork", "the image of %s was not taken by this runtime", s.Fork.Source)
		}
		if s.Fork.Memory && s.engine() != EngineGVisor {
			return errdefs.Invalid("Fork", "an image with processes restores on gVisor only, not on %s", s.engine())
		}
		if s.Fork.Memory && (s.Netns != "") != filesOf(s.Fork).network {
			return errdefs.Invalid("Fork", "a copy restores with the network mode of its source: give it a network namespace exactly when the source had one")
		}
		s.DiskBytes = s.Fork.DiskBytes
	}
	for _, p := range []string{s.Netns, s.ResolvConf} {
		if p != "" && !filepath.IsAbs(p) {
			return errdefs.Invalid("Netns", "%q is not an absolute path", p)
		}
	}
	if s.Hostname == "" {
		s.Hostname = strings.Trim(strings.ReplaceAll(s.ID, "_", "-"), ".-")
		if len(s.Hostname) > 63 {
			s.Hostname = strings.Trim(s.Hostname[:63], ".-")
		}
	}
	if !hostnameRE.MatchString(s.Hostname) {
		return errdefs.Invalid("Hostname", "%q is not a valid hostname", s.Hostname)
	}
	if len(s.Lower) == 0 {
		return errdefs.Invalid("Lower", "at least one layer is needed")
	}
	for _, l := range s.Lower {
		if !filepath.IsAbs(l) {
			return errdefs.Invalid("Lower", "layer %q is not an absolute path", l)
		}
		if st, err := os.Stat(l); err != nil || !st.IsDir() {
			return errdefs.Invalid("Lower", "layer %q is not a directory", l)
		}
	}
	if !filepath.IsAbs(s.AgentPath) {
		return errdefs.Invalid("AgentPath", "%q is not an absolute path", s.AgentPath)
	}
	if err := checkVolumes(s.Volumes); err != nil {
		return err
	}
	if s.Workdir != "" && (!filepath.IsAbs(s.Workdir) || strings.ContainsRune(s.Workdir, 0)) {
		return errdefs.Invalid("Workdir", "%q is not an absolute path", s.Workdir)
	}
	for _, e := range s.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return errdefs.Invalid("Env", "%q is not KEY=VALUE", e)
		}
	}
	// The limits come resolved by admission (internal/limits), which owns their defaults and
	// bounds; one missing or out of what runc can enforce is the caller's bug, not the user's.
	switch {
	case !(s.CPUs >= 0.01 && s.CPUs <= 1024):
		return fmt.Errorf("spec of %s: CPUs %v is not a resolved limit (want [0.01, 1024])", s.ID, s.CPUs)
	case s.MemoryBytes < 4<<20:
		return fmt.Errorf("spec of %s: MemoryBytes %d is not a resolved limit (want at least 4 MiB)", s.ID, s.MemoryBytes)
	case s.Pids <= 0:
		return fmt.Errorf("spec of %s: Pids %d is not a resolved limit", s.ID, s.Pids)
	case s.DiskBytes < minDiskBytes:
		return fmt.Errorf("spec of %s: DiskBytes %d is not a resolved limit (want at least %d)", s.ID, s.DiskBytes, minDiskBytes)
	case s.OpenFiles == 0:
		return fmt.Errorf("spec of %s: OpenFiles 0 is not a resolved limit", s.ID)
	case s.ShmBytes <= 0:
		return fmt.Errorf("spec of %s: ShmBytes %d is not a resolved size", s.ID, s.ShmBytes)
	}
	if s.OpenFiles > maxOpenFiles {
		// This host's own ceiling (fs.nr_open, runc's hard limit), below the policy's.
		return errdefs.Invalid("limits.open_files", "%d is over what this host allows (%d)", s.OpenFiles, maxOpenFiles)
	}
	return nil
}

// defaultCaps is the sandbox's capability set: Docker's default set without NET_RAW (no
// SYS_ADMIN, SYS_PTRACE, SYS_MODULE, NET_RAW or SYS_RESOURCE). It lives in agentrpc because a
// calls agent drops each call's command to exactly this set.
var defaultCaps = agentrpc.SandboxCaps()

// callsCaps is the agent's set in a sandbox that runs calls (Spec.Calls).
var callsCaps = append(agentrpc.SandboxCaps(), "CAP_SYS_ADMIN")

// maskedPaths are hidden (files: /dev/null bound over them; directories: an empty read-only
// tmpfs): the sandbox policy and the host facts a container would read from the host's kernel
// (agentrpc.HostFactPaths). readonlyPaths are bound read-only. A calls agent repeats both on each
// call's /proc.
var (
	maskedPaths   = append(agentrpc.MaskedPaths(), agentrpc.HostFactPaths()...)
	readonlyPaths = agentrpc.ReadonlyPaths()
)

// template is the part of the OCI spec that is the same for every sandbox, built once. Docker's
// seccomp profile is most of the JSON, so it is encoded once and its bytes spliced into each
// rendered spec (json.RawMessage would re-validate all of it every time).
type template struct {
	spec    specs.Spec
	seccomp json.RawMessage
	// callsSeccomp is the profile of a sandbox that runs calls: built for callsCaps, with
	// pivot_root allowed, native architecture only (the calls' own filter knows no other).
	callsSeccomp json.RawMessage
	// seccompBPF and callsSeccompBPF are those profiles compiled (internal/seccompbpf, encoded
	// for seccompbpf.EnvVar), or "" where runc compiles the profile (SeccompInRunc, or one the
	// compiler does not take). A runc sandbox with a compiled profile gets no "seccomp" in its
	// config.json: its agent installs the program before anything else.
	seccompBPF, callsSeccompBPF string
}

// newTemplate builds the spec template. agentOOMScoreAdj is the agent's oom_score_adj, or nil to
// leave it inherited (when this process may not lower it). allArches keeps the seccomp profile's
// compat sub-architectures (x86 and x32 on amd64); otherwise only the native one is allowed.
// compile compiles the profiles once where internal/seccompbpf takes them.
func newTemplate(agentOOMScoreAdj *int, allArches, compile bool) (*template, error) {
	caps := &specs.LinuxCapabilities{
		Bounding:  defaultCaps,
		Effective: defaultCaps,
		Permitted: defaultCaps,
	}
	s := specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: "rootfs"},
		Process: &specs.Process{
			User:            specs.User{UID: 0, GID: 0},
			Cwd:             "/",
			Capabilities:    caps,
			NoNewPrivileges: true,
			OOMScoreAdj:     agentOOMScoreAdj,
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm"}, // options per sandbox
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace}, {Type: specs.CgroupNamespace},
			},
			MaskedPaths:   maskedPaths,
			ReadonlyPaths: readonlyPaths,
			// rslave, not rprivate: the binds of LXCFS's files must stay slaves of the host's
			// view of them, so an LXCFS restarted on the host reaches running sandboxes
			// (internal/lxcfs). Nothing flows back to the host, and host mounts reach only the
			// copies under the old root, which runc detaches.
			RootfsPropagation: "rslave",
		},
	}
	t := &template{spec: s}
	var err error
	if t.seccomp, t.seccompBPF, err = seccompProfile(&s, allArches, nil, compile); err != nil {
		return nil, err
	}
	calls := s
	callsProc := *s.Process
	callsProc.Capabilities = &specs.LinuxCapabilities{Bounding: callsCaps, Effective: callsCaps, Permitted: callsCaps}
	calls.Process = &callsProc
	if t.callsSeccomp, t.callsSeccompBPF, err = seccompProfile(&calls, false, []string{"pivot_root"}, compile); err != nil {
		return nil, err
	}
	return t, nil
}

// agentCrashSignals are the signals the Go runtime takes for a fault of its own, and panics or
// throws on, when their siginfo says the kernel or a queue sent them, whatever os/signal traps
// (sighandler's sigFromUser is SI_USER or SI_TKILL only; Go issue 26625). The agent and the
// calls' helpers are Go programs, PID 1 of their namespaces.
var agentCrashSignals = []uint32{
	uint32(unix.SIGILL), uint32(unix.SIGTRAP), uint32(unix.SIGBUS), uint32(unix.SIGFPE),
	uint32(unix.SIGSEGV), uint32(unix.SIGSTKFLT), uint32(unix.SIGSYS),
}

// agentGuards refuse a sandbox's processes the calls that send agentCrashSignals with a siginfo
// of their choosing: sigqueue (SI_QUEUE), pidfd_send_signal with a siginfo, and a file's SIGIO
// set to one of them with F_SETSIG. A plain kill or tgkill says SI_USER or SI_TKILL, which the
// agent's runtime drops (agentrpc.Harden). Without them any process of the sandbox could crash
// its agent, and so end the sandbox, as the red-team case "fault signals to PID 1" did. Only the
// in-process compiler adds them: SeccompInRunc and SeccompAllArches, kept for benchmarks, go
// without.
var agentGuards = []seccompbpf.Guard{
	{Call: "rt_sigqueueinfo", Conds: []seccompbpf.GuardCond{{Arg: 1, In: agentCrashSignals}}},
	{Call: "rt_tgsigqueueinfo", Conds: []seccompbpf.GuardCond{{Arg: 2, In: agentCrashSignals}}},
	{Call: "pidfd_send_signal", Conds: []seccompbpf.GuardCond{{Arg: 1, In: agentCrashSignals}, {Arg: 2, NonZero: true}}},
	{Call: "fcntl", Conds: []seccompbpf.GuardCond{{Arg: 1, In: []uint32{unix.F_SETSIG}}, {Arg: 2, In: agentCrashSignals}}},
}

// seccompProfile encodes Docker's default profile for s's capabilities, with the syscalls in
// allow allowed besides, and with compile also compiles it (internal/seccompbpf, encoded for
// seccompbpf.EnvVar; "" when the compiler does not take the profile: runc then compiles it).
func seccompProfile(s *specs.Spec, allArches bool, allow []string, compile bool) (json.RawMessage, string, error) {
	sc, err := seccomp.GetDefaultProfile(s)
	if err != nil {
		return nil, "", fmt.Errorf("build seccomp profile: %w", err)
	}
	// runc compiles the profile with libseccomp in every container's init, once per
	// architecture listed: measured here, Docker's three (x86_64, x86, x32) cost ~40 ms per
	// start, the native one alone ~12 ms. A syscall made through a missing sub-architecture
	// (a 32-bit binary, int 0x80) kills the thread, which is stricter than Docker.
	if !allArches && len(sc.Architectures) > 1 {
		sc.Architectures = sc.Architectures[:1]
	}
	if len(allow) > 0 {
		sc.Syscalls = append(sc.Syscalls, specs.LinuxSyscall{Names: allow, Action: specs.ActAllow})
	}
	raw, err := json.Marshal(sc)
	if err != nil {
		return nil, "", fmt.Errorf("encode seccomp profile: %w", err)
	}
	if !compile {
		return raw, "", nil
	}
	p, err := seccompbpf.CompileGuarded(sc, agentGuards)
	if errors.Is(err, seccompbpf.ErrUnsupported) {
		return raw, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("compile the seccomp profile: %w", err)
	}
	return raw, p.Encode(), nil
}

// gvisorPaths are the host paths a gVisor sandbox's spec binds in (see gvisor.go).
type gvisorPaths struct {
	agentBin string // the agent binary, read-only, at gvisorAgentPath
}

// render returns config.json for s (normalized) with its cgroup at cgroupsPath; gv is set for
// a gVisor sandbox. facts are LXCFS's files to bind read-only over /proc and /sys (runc only).
//
// With ux the sandbox joins its user namespace (userns.go): its rootfs is ux.rootfs, it gets
// the per-user budgets as rlimits, and /sys is ux.sysfs bound when set.
// vols are the volumes' mount entries (volumeMounts), which go last.
func (t *template) render(s *Spec, cgroupsPath string, gv *gvisorPaths, facts []lxcfs.Bind, ux *usernsSpec, budgets Budgets, vols ...specs.Mount) ([]byte, error) {
	spec := t.spec
	proc := *t.spec.Process
	if gv != nil {
		proc.Args = append([]string{gvisorAgentPath}, s.AgentArgs...)
		proc.Args = append(proc.Args, "--stdio")
	} else {
		proc.Args = append([]string{agentExecPath}, s.AgentArgs...)
	}
	profile, bpf := t.seccomp, t.seccompBPF
	if s.Calls {
		if !slices.Contains(s.AgentArgs, "--calls") {
			proc.Args = append(proc.Args, "--calls")
		}
		proc.Capabilities = &specs.LinuxCapabilities{Bounding: callsCaps, Effective: callsCaps, Permitted: callsCaps}
		profile, bpf = t.callsSeccomp, t.callsSeccompBPF
	}
	proc.Env = agentrpc.DefaultEnv(s.Env)
	if gv != nil {
		bpf = "" // runsc takes the profile as it is
	}
	if bpf != "" {
		// The agent installs the compiled profile on itself before anything else and drops
		// the variable; runc gets no profile to compile.
		proc.Env = append(proc.Env, seccompbpf.EnvVar+"="+bpf)
		profile = nil
	}
	proc.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: s.OpenFiles, Soft: s.OpenFiles}}
	if ux != nil {
		// Counted per user of the sandbox's namespace (its owner is the sandbox's own uid).
		nproc := uint64(budgets.Procs)
		if nproc == 0 {
			// Above pids.max: the sandbox's pids cgroup, whose refusals are counted, is what
			// stops a fork bomb; this bounds each user within it.
			nproc = 2 * uint64(hostPids(s))
		}
		proc.Rlimits = append(proc.Rlimits,
			specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: nproc, Soft: nproc},
			specs.POSIXRlimit{Type: "RLIMIT_MSGQUEUE", Hard: uint64(budgets.MsgQueueBytes), Soft: uint64(budgets.MsgQueueBytes)})
		spec.Root = &specs.Root{Path: ux.rootfs}
		if ux.agentRlimits {
			// runc cannot set them from outside the namespace: the agent sets them on itself.
			limits := make([]rlimitenv.Limit, len(proc.Rlimits))
			for i, l := range proc.Rlimits {
				limits[i] = rlimitenv.Limit{Name: l.Type, Soft: l.Soft, Hard: l.Hard}
			}
			env, err := rlimitenv.Encode(limits)
			if err != nil {
				return nil, err
			}
			proc.Env, proc.Rlimits = append(proc.Env, env), nil
		}
	}
	spec.Process = &proc
	spec.Hostname = s.Hostname

	spec.Mounts = append([]specs.Mount(nil), t.spec.Mounts...)
	for i := range spec.Mounts {
		if spec.Mounts[i].Destination == "/dev/shm" {
			spec.Mounts[i].Options = []string{"nosuid", "noexec", "nodev", "mode=1777", fmt.Sprintf("size=%d", s.ShmBytes)}
		}
		if spec.Mounts[i].Destination == "/sys" && ux != nil && ux.sysfs != "" {
			spec.Mounts[i] = specs.Mount{Destination: "/sys", Type: "bind", Source: ux.sysfs,
				Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}}
		}
	}
	if s.ResolvConf != "" {
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: s.ResolvConf,
			Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
	}
	for _, f := range facts {
		// No options: runc then binds with one mount call instead of three (a bind, a remount
		// for flags, one for propagation). The bind copies the flags of the host's mount of the
		// file, read-only, nosuid, nodev and noexec (internal/lxcfs: LXCFS's file, or the
		// read-only view under it), locked when the sandbox has a user namespace (makeView
		// says what holds without one); and it is a slave of the host's view file, as the copy
		// of that mount in the container's namespace is once runc has made its root rslave
		// (before any bind).
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: f.Target, Type: "bind", Source: f.Source, Options: []string{"bind"}})
	}
	if gv != nil {
		spec.Mounts = append(spec.Mounts,
			specs.Mount{Destination: gvisorAgentPath, Type: "bind", Source: gv.agentBin,
				Options: []string{"bind", "ro", "nosuid", "nodev"}})
	}
	// Volumes last, each an entry of its own (volumes.go).
	spec.Mounts = append(spec.Mounts, vols...)

	linux := *t.spec.Linux
	linux.CgroupsPath = cgroupsPath
	if len(facts) > 0 {
		// runc masks after it mounts: a mask of a file LXCFS serves would hide LXCFS's.
		linux.MaskedPaths = slices.DeleteFunc(slices.Clone(linux.MaskedPaths), func(p string) bool {
			return slices.ContainsFunc(facts, func(f lxcfs.Bind) bool { return f.Target == p })
		})
	}
	if ux != nil {
		linux.Namespaces = append(slices.Clone(linux.Namespaces), specs.LinuxNamespace{Type: specs.UserNamespace, Path: ux.path})
	}
	if s.Netns != "" {
		linux.Namespaces = slices.Clone(linux.Namespaces)
		for i := range linux.Namespaces {
			if linux.Namespaces[i].Type == specs.NetworkNamespace {
				linux.Namespaces[i].Path = s.Netns
			}
		}
	}
	period := uint64(100000)
	quota := int64(math.Round(s.CPUs * float64(period)))
	linux.Resources = &specs.LinuxResources{
		// runc adds its default device allow-list (null, zero, full, tty, random, urandom, ptmx,
		// pts) after this deny-all.
		Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
		Memory:  &specs.LinuxMemory{Limit: ptr(s.MemoryBytes), Swap: ptr(s.MemoryBytes)},
		CPU:     &specs.LinuxCPU{Quota: &quota, Period: &period},
		Pids:    &specs.LinuxPids{Limit: ptr(hostPids(s))},
	}
	spec.Linux = &linux
	b, err := json.Marshal(&spec)
	if err != nil {
		return nil, err
	}
	if profile == nil {
		return b, nil
	}
	// Splice the pre-encoded profile in as the first field of "linux". The key cannot occur
	// inside an encoded string (its quotes would be escaped), so the first match is the field.
	key := []byte(`"linux":{`)
	i := bytes.Index(b, key)
	if i < 0 {
		return nil, errors.New("render spec: no linux section")
	}
	i += len(key)
	out := make([]byte, 0, len(b)+len(profile)+16)
	out = append(out, b[:i]...)
	out = append(out, `"seccomp":`...)
	out = append(out, profile...)
	out = append(out, ',') // linux always has more fields: namespaces, resources, cgroupsPath
	return append(out, b[i:]...), nil
}

// gvisorPidsHeadroom is added to a gVisor sandbox's pids limit: the host's pids.max counts the
// sentry's and gofer's own threads (Go runtime, platform stubs) besides the guest's tasks, and a
// sentry that cannot start a thread dies (gVisor issue #2490) instead of failing the guest's fork.
const gvisorPidsHeadroom = 256

// hostPids is the pids.max of the sandbox's host cgroup.
func hostPids(s *Spec) int64 {
	if s.engine() == EngineGVisor {
		return s.Pids + gvisorPidsHeadroom
	}
	return s.Pids
}

func ptr[T any](v T) *T { return &v }

// canLowerOOMScore reports whether this process has CAP_SYS_RESOURCE, which writing a negative
// oom_score_adj for the agent needs (runc writes it as this process's child).
func canLowerOOMScore() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[unix.CAP_SYS_RESOURCE/32].Effective&(1<<(unix.CAP_SYS_RESOURCE%32)) != 0
}
