package cli

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	corral "github.com/corral-dev/corral/sdk/go"
)

// sizeUnits maps a size suffix (lower-cased) to its multiplier. Bare K/M/G/T and the IEC forms
// are binary, as in docker and Kubernetes' Ki/Mi; the SI forms kB/MB/GB/TB are decimal.
var sizeUnits = map[string]float64{
	"": 1, "b": 1,
	"k": 1 << 10, "ki": 1 << 10, "kib": 1 << 10, "kb": 1e3,
	"m": 1 << 20, "mi": 1 << 20, "mib": 1 << 20, "mb": 1e6,
	"g": 1 << 30, "gi": 1 << 30, "gib": 1 << 30, "gb": 1e9,
	"t": 1 << 40, "ti": 1 << 40, "tib": 1 << 40, "tb": 1e12,
}

// byteSize is a pflag.Value of a byte size ("10G", "512M", "1048576").
type byteSize struct{ dst *int64 }

func (b *byteSize) String() string {
	if b.dst == nil || *b.dst == 0 {
		return ""
	}
	return strconv.FormatInt(*b.dst, 10)
}

func (b *byteSize) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	*b.dst = n
	return nil
}

func (b *byteSize) Type() string { return "size" }

// parseSize parses a byte size: "1048576", "512M", "1G", "1GiB", "1.5g", "100MB".
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	}
	mult, ok := sizeUnits[unit]
	if !ok || num == "" {
		return 0, fmt.Errorf("%q is not a size (use bytes or a suffix: 512M, 1G, 1GiB, 100MB)", s)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%q is not a size (use bytes or a suffix: 512M, 1G, 1GiB, 100MB)", s)
	}
	b := math.Round(v * mult)
	if b >= math.MaxInt64 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return int64(b), nil
}

// parseVolumeMount parses --volume NAME:/path[:ro|:rw].
func parseVolumeMount(s string) (corral.VolumeMount, error) {
	name, rest, ok := strings.Cut(s, ":")
	if !ok || name == "" || !strings.HasPrefix(rest, "/") {
		return corral.VolumeMount{}, usagef("--volume %q: want NAME:/path or NAME:/path:ro", s)
	}
	m := corral.VolumeMount{Name: name, Path: rest}
	if p, mode, ok := strings.Cut(rest, ":"); ok {
		switch mode {
		case "ro":
			m.ReadOnly = true
		case "rw":
		default:
			return corral.VolumeMount{}, usagef("--volume %q: the mode after the path is ro or rw, not %q", s, mode)
		}
		m.Path = p
	}
	return m, nil
}

// parseKV splits "KEY=VALUE" pairs into a map; flag names the flag for the error message.
func parseKV(flag string, pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, usagef("--%s %q: want KEY=VALUE", flag, p)
		}
		m[k] = v
	}
	return m, nil
}

// checkEnv checks that every entry is KEY=VALUE (the value may be empty).
func checkEnv(env []string) error {
	for _, e := range env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return usagef("--env %q: want KEY=VALUE", e)
		}
	}
	return nil
}

// checkRef checks a NAME:VERSION layer reference.
func checkRef(flag, ref string) error {
	name, version, ok := strings.Cut(ref, ":")
	if !ok || name == "" || version == "" || strings.Contains(version, ":") {
		return usagef("--%s %q: want NAME:VERSION", flag, ref)
	}
	return nil
}

// checkDuration checks a Go duration flag ("30m", "2h"); empty is allowed.
func checkDuration(flag, s string) error {
	if s == "" {
		return nil
	}
	if d, err := time.ParseDuration(s); err != nil || d < 0 {
		return usagef("--%s %q: want a duration such as 30m or 2h", flag, s)
	}
	return nil
}

// createFlags are the flags that describe a new sandbox, shared by create and run.
type createFlags struct {
	base, workspace           string
	toolkits                  []string
	cpus                      float64
	memory, disk, outputLimit string
	pids, openFiles           int64
	env, labels, nodeSelector []string
	ttl, idleTTL              string
	hostname                  string
	autoPause                 string
	pauseKeepsTTL             bool
	fromSnapshot              string
	runtime, tier             string
	image                     string
	fetch                     string
	volumes                   []string
	net                       netFlags
	baseDefault               string // what --base is when not given
}

// netFlags are the egress policy flags of create, run and net set.
type netFlags struct {
	mode        string
	allow, deny []string
}

func (n *netFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&n.mode, "net", "", "network: none (loopback only, the default), allowlist or open")
	fs.StringArrayVar(&n.allow, "net-allow", nil, "allow a service, domain (pypi.org, *.example.com) or CIDR[:PORT][/tcp|udp] (repeatable)")
	fs.StringArrayVar(&n.deny, "net-deny", nil, "deny a service, domain or CIDR[:PORT][/tcp|udp]; deny wins (repeatable)")
}

// policy returns the policy the flags give, or nil when none was given.
func (n *netFlags) policy() (*corral.NetworkPolicy, error) {
	switch n.mode {
	case "", corral.NetworkNone, corral.NetworkAllowlist, corral.NetworkOpen:
	default:
		return nil, usagef("--net: %q: want none, allowlist or open", n.mode)
	}
	if n.mode == "" && len(n.allow) == 0 && len(n.deny) == 0 {
		return nil, nil
	}
	return &corral.NetworkPolicy{Mode: n.mode, Allow: n.allow, Deny: n.deny}, nil
}

// add registers the flags on fs; the default base is $CORRAL_BASE or base:default.
func (f *createFlags) add(fs *pflag.FlagSet, getenv func(string) string) {
	base := getenv("CORRAL_BASE")
	if base == "" {
		base = defaultBase
	}
	f.baseDefault = base
	fs.StringVar(&f.base, "base", base, "base layer NAME:VERSION ($CORRAL_BASE sets the default)")
	fs.StringVar(&f.tier, "tier", "", "isolation tier: container (default), microvm (a VM with its own kernel, QEMU) or vm (a full machine with a screen, from --image)")
	fs.StringVar(&f.image, "image", "", "with --tier vm: the disk image, a vm-image layer NAME:VERSION (corral vm-image build)")
	fs.StringVar(&f.runtime, "runtime", "", "container runtime: runc (default) or gvisor")
	fs.StringVar(&f.fetch, "fetch", "", "how the layers' data reaches the node: eager (all before start), lazy (chunks as read) or prefetch (lazy, plus the environment's recorded start-up set at once; the node's default, usually)")
	f.net.add(fs)
	fs.StringVar(&f.workspace, "workspace", "", "workspace layer NAME:VERSION")
	fs.StringArrayVar(&f.toolkits, "toolkit", nil, "toolkit layer NAME:VERSION (repeatable)")
	fs.Float64Var(&f.cpus, "cpus", 0, "CPU quota in cores, e.g. 0.5")
	fs.StringVar(&f.memory, "memory", "", "memory limit, e.g. 512M or 2GiB")
	fs.Int64Var(&f.pids, "pids", 0, "maximum number of processes and threads")
	fs.StringVar(&f.disk, "disk", "", "size of the writable layer, e.g. 10G")
	fs.Int64Var(&f.openFiles, "open-files", 0, "open file limit (RLIMIT_NOFILE) of every process")
	fs.StringVar(&f.outputLimit, "output-limit", "", "output kept per command, e.g. 16M")
	fs.StringArrayVar(&f.env, "env", nil, "KEY=VALUE: an environment variable for every command (repeatable); NAME: create from the saved environment NAME (corral env create)")
	fs.StringArrayVar(&f.labels, "label", nil, "label KEY=VALUE (repeatable)")
	fs.StringArrayVar(&f.volumes, "volume", nil, "mount the volume NAME of the sandbox's project: NAME:/path or NAME:/path:ro (repeatable; corral volume create)")
	fs.StringArrayVar(&f.nodeSelector, "node-selector", nil, "in a cluster, run on a node with label KEY=VALUE, e.g. gpu=h100 (repeatable)")
	fs.StringVar(&f.ttl, "ttl", "", "lifetime, e.g. 30m (default: the server's)")
	fs.StringVar(&f.idleTTL, "idle-ttl", "", "stop after this long without activity, e.g. 10m")
	fs.StringVar(&f.hostname, "hostname", "", "hostname inside the sandbox (default: its ID)")
	fs.StringVar(&f.fromSnapshot, "from-snapshot", "", "start from a snapshot layer NAME:VERSION (its environment comes with it)")
	fs.StringVar(&f.autoPause, "auto-pause-after", "", "pause (not stop) after this long without activity, e.g. 10m")
	fs.BoolVar(&f.pauseKeepsTTL, "pause-keeps-ttl", true, "paused time counts against the TTL (false: the expiry moves later by the time paused)")
}

// request validates the flags and builds the create request.
func (f *createFlags) request() (corral.CreateRequest, error) {
	req := corral.CreateRequest{
		Base:      f.base,
		Workspace: f.workspace,
		Toolkits:  f.toolkits,
		Env:       envVars(f.env),
		TTL:       f.ttl,
		IdleTTL:   f.idleTTL,
		Hostname:  f.hostname,
		Limits:    corral.Limits{CPUs: f.cpus, Pids: f.pids, OpenFiles: f.openFiles},
		Runtime:   f.runtime,
		Tier:      f.tier,
		Fetch:     f.fetch,

		AutoPauseAfter: f.autoPause,
		FromSnapshot:   f.fromSnapshot,
	}
	if f.fromSnapshot != "" {
		// The snapshot brings its environment: the default base does not apply.
		req.Base = ""
		if err := checkRef("from-snapshot", f.fromSnapshot); err != nil {
			return req, err
		}
	}
	switch f.fetch {
	case "", "eager", "lazy", "prefetch":
	default:
		return req, usagef("--fetch: %q: want eager, lazy or prefetch", f.fetch)
	}
	switch f.runtime {
	case "", "runc", "gvisor":
	case "qemu":
		if f.tier != "microvm" && f.tier != "vm" {
			return req, usagef("--runtime qemu: only with --tier microvm or vm")
		}
	default:
		return req, usagef("--runtime: %q: want runc or gvisor", f.runtime)
	}
	switch f.tier {
	case "", "container", "microvm":
		if f.image != "" {
			return req, usagef("--image is the disk image of a vm: use it with --tier vm (containers and microvms take --base)")
		}
	case "vm":
		if f.image == "" {
			return req, usagef("--tier vm needs --image NAME:VERSION, a vm-image layer (corral vm-image build NAME:VERSION)")
		}
		if err := checkRef("image", f.image); err != nil {
			return req, err
		}
		if f.base != f.baseDefault || f.workspace != "" || len(f.toolkits) > 0 || f.fromSnapshot != "" {
			return req, usagef("--tier vm boots --image: drop --base, --workspace, --toolkit and --from-snapshot")
		}
		req.Image, req.Base = f.image, ""
	default:
		return req, usagef("--tier: %q: want container, microvm or vm", f.tier)
	}
	for _, v := range f.volumes {
		m, err := parseVolumeMount(v)
		if err != nil {
			return req, err
		}
		req.Volumes = append(req.Volumes, m)
	}
	pol, err := f.net.policy()
	if err != nil {
		return req, err
	}
	req.Network = pol
	if !f.pauseKeepsTTL {
		req.PauseKeepsTTL = &f.pauseKeepsTTL
	}
	if err := checkDuration("auto-pause-after", f.autoPause); err != nil {
		return req, err
	}
	if req.Base != "" {
		if err := checkRef("base", f.base); err != nil {
			return req, err
		}
	}
	if f.workspace != "" {
		if err := checkRef("workspace", f.workspace); err != nil {
			return req, err
		}
	}
	for _, t := range f.toolkits {
		if err := checkRef("toolkit", t); err != nil {
			return req, err
		}
	}
	if f.cpus < 0 || f.pids < 0 || f.openFiles < 0 {
		return req, usagef("--cpus, --pids and --open-files must not be negative")
	}
	for _, s := range []struct {
		flag, value string
		dst         *int64
	}{
		{"memory", f.memory, &req.Limits.MemoryBytes},
		{"disk", f.disk, &req.Limits.DiskBytes},
		{"output-limit", f.outputLimit, &req.Limits.OutputBytes},
	} {
		if s.value == "" {
			continue
		}
		n, err := parseSize(s.value)
		if err != nil {
			return req, usagef("--%s: %v", s.flag, err)
		}
		*s.dst = n
	}
	names := envNames(f.env)
	switch {
	case len(names) > 1:
		return req, usagef("--env NAME given %d times (%s): one saved environment per sandbox", len(names), strings.Join(names, ", "))
	case len(names) == 1:
		if f.base != f.baseDefault || f.workspace != "" || len(f.toolkits) > 0 || f.fromSnapshot != "" {
			return req, usagef("--env %s names its layers: drop --base, --workspace, --toolkit and --from-snapshot", names[0])
		}
		req.Environment, req.Base = names[0], ""
	}
	if err := checkEnv(envVars(f.env)); err != nil {
		return req, err
	}
	labels, err := parseKV("label", f.labels)
	if err != nil {
		return req, err
	}
	req.Labels = labels
	if req.NodeSelector, err = parseKV("node-selector", f.nodeSelector); err != nil {
		return req, err
	}
	if err := checkDuration("ttl", f.ttl); err != nil {
		return req, err
	}
	if err := checkDuration("idle-ttl", f.idleTTL); err != nil {
		return req, err
	}
	return req, nil
}

// envVars are the --env values that set a variable (KEY=VALUE); envNames the others, which name
// a saved environment.
func envVars(env []string) []string {
	var out []string
	for _, e := range env {
		if strings.Contains(e, "=") {
			out = append(out, e)
		}
	}
	return out
}

func envNames(env []string) []string {
	var out []string
	for _, e := range env {
		if !strings.Contains(e, "=") {
			out = append(out, e)
		}
	}
	return out
}

// SizeFlag returns a pflag.Value that parses a byte size ("10G", "512M", "1048576") into dst,
// for command lines outside this package (corral-bench) that take sizes the same way.
func SizeFlag(dst *int64) pflag.Value { return &byteSize{dst} }
