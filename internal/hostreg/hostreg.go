// Package hostreg is the host-wide registry of Corral instances: it hands each data dir the
// host resources that must not be shared between two Corrals on one machine (its network tag and
// address pool, its NFLOG group, its cgroup parent, its range of VM uids and its range of sandbox
// user-namespace ids), and refuses a
// request that would collide with another instance's.
//
// The registry is one JSON file (default /run/corral/instances.json) changed only under an
// exclusive flock of its lock file, so concurrent starts cannot hand out the same resource. An
// entry belongs to a data dir, not to a process: a stopped Corral's sandboxes keep running with
// their network slots and cgroups, so its claim stays until its data dir is gone (an entry whose
// data dir no longer exists is pruned by the next Acquire) or Release removes it (`corral up
// --cleanup`). The same data dir always gets its claim back, so a restart re-adopts its own
// interfaces, tables and VMs.
//
// The registry lives on /run, a tmpfs: after a reboot nothing it described exists any more.
package hostreg

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lazyregexp"
)

// DefaultDir is where the registry lives.
const DefaultDir = "/run/corral"

// DefaultDataDir is the data dir that keeps the historical defaults (tag "0", pool
// 10.200.0.0/16, cgroup /corral) when they are free, so an existing installation's sandboxes
// are re-adopted unchanged.
const DefaultDataDir = "/var/lib/corral"

const (
	// poolBase is where automatic address pools come from: a /16 per instance, 10.200-10.249.
	poolFirst, poolLast = 200, 249
	// VMUIDBase is the first host uid of VM ranges; each instance gets VMUIDCount of them.
	VMUIDBase  = 0x70000000
	VMUIDCount = 1 << 16
	// vmUIDSlots bounds how many instances can hold a VM uid range (0x70000000 + 4096 * 65536
	// stays below 0x80000000).
	vmUIDSlots = 4096
	// SandboxUIDBase is the first host uid (and gid) of the ranges container sandboxes' user
	// namespaces map to; each instance gets SandboxUIDSlots ranges of SandboxUIDSize ids, so
	// sandboxUIDClaims instances fit below 0xFFFF0000 (uid -1 and the overflow ids stay out).
	SandboxUIDBase   = 0x80000000
	SandboxUIDSize   = 1 << 16
	SandboxUIDSlots  = 512
	sandboxUIDClaims = (0xFFFF0000 - SandboxUIDBase) / (SandboxUIDSize * SandboxUIDSlots)
	// logGroupFirst..logGroupLast is the range NFLOG groups are chosen from.
	logGroupFirst, logGroupLast = 1000, 60999
)

var tagRE = lazyregexp.New(`^[a-z0-9]{1,4}$`)

// Request is what a starting instance asks for. Empty fields are chosen by the registry.
type Request struct {
	// DataDir is the instance's data dir (absolute).
	DataDir string
	// Tag, Pool and CgroupParent, when set, are the operator's explicit choice: refused if
	// another instance holds them (or an overlapping pool).
	Tag          string
	Pool         string
	CgroupParent string
}

// Claim is what an instance holds.
type Claim struct {
	DataDir      string `json:"data_dir"`
	Tag          string `json:"tag"`
	Pool         string `json:"pool"`
	LogGroup     uint16 `json:"log_group"`
	CgroupParent string `json:"cgroup_parent"`
	// VMUIDBase is the first of VMUIDCount host uids this instance's VMs run as.
	VMUIDBase uint32 `json:"vm_uid_base"`
	// SandboxUIDBase is the first of SandboxUIDSlots*SandboxUIDSize host uids (and gids) this
	// instance's container sandboxes' user namespaces map to. Zero in a claim written by a
	// Corral that predates it: Acquire then adds one.
	SandboxUIDBase uint32    `json:"sandbox_uid_base,omitempty"`
	Since          time.Time `json:"since"`
}

type file struct {
	Instances []Claim `json:"instances"`
}

// Registry is the registry in one directory.
type Registry struct {
	dir string
	// hostAddrs are addresses of this host's interfaces, which an automatic pool must avoid;
	// tests set it.
	hostAddrs func() []netip.Prefix
}

// Open returns the registry in dir (DefaultDir when empty), creating the directory.
func Open(dir string) (*Registry, error) {
	if dir == "" {
		dir = DefaultDir
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("host registry %s: %w", dir, err)
	}
	return &Registry{dir: dir, hostAddrs: hostPrefixes}, nil
}

func (r *Registry) path() string { return filepath.Join(r.dir, "instances.json") }

// locked runs f with the registry read, under its lock, and writes back what f returns true for.
func (r *Registry) locked(f func(*file) (bool, error)) error {
	lk, err := os.OpenFile(filepath.Join(r.dir, "instances.lock"), os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("host registry: %w", err)
	}
	defer lk.Close()
	if err := syscall.Flock(int(lk.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("host registry: lock: %w", err)
	}
	var reg file
	b, err := os.ReadFile(r.path())
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("host registry: %w", err)
	default:
		if err := json.Unmarshal(b, &reg); err != nil {
			return fmt.Errorf("host registry %s is corrupt (%v): remove it only once no Corral runs on this host", r.path(), err)
		}
	}
	write, err := f(&reg)
	if err != nil || !write {
		return err
	}
	sort.Slice(reg.Instances, func(i, j int) bool { return reg.Instances[i].DataDir < reg.Instances[j].DataDir })
	out, err := json.MarshalIndent(reg, "", "  ")
	if err != nil {
		return err
	}
	tmp := r.path() + ".tmp"
	if err := os.WriteFile(tmp, append(out, '\n'), 0o600); err != nil {
		return fmt.Errorf("host registry: %w", err)
	}
	if err := os.Rename(tmp, r.path()); err != nil {
		return fmt.Errorf("host registry: %w", err)
	}
	return nil
}

// Acquire returns the claim of req.DataDir: the one it holds already (explicit choices in req
// must then match it, or the operator is told how to change them), or a new one. A new claim
// honours req's explicit fields when no other instance holds them and chooses the rest.
func (r *Registry) Acquire(req Request) (Claim, error) {
	if !filepath.IsAbs(req.DataDir) {
		return Claim{}, errdefs.Invalid("data-dir", "%q is not absolute", req.DataDir)
	}
	if req.Tag != "" && !tagRE.MatchString(req.Tag) {
		return Claim{}, errdefs.Invalid("net-tag", "%q: want 1-4 of [a-z0-9]", req.Tag)
	}
	var reqPool netip.Prefix
	if req.Pool != "" {
		p, err := netip.ParsePrefix(req.Pool)
		if err != nil || !p.Addr().Is4() {
			return Claim{}, errdefs.Invalid("net-pool", "%q is not an IPv4 prefix", req.Pool)
		}
		reqPool = p.Masked()
	}
	if req.CgroupParent != "" && (!strings.HasPrefix(req.CgroupParent, "/") || strings.Contains(req.CgroupParent, "..")) {
		return Claim{}, errdefs.Invalid("cgroup-parent", "%q: want an absolute cgroup path", req.CgroupParent)
	}
	var out Claim
	err := r.locked(func(reg *file) (bool, error) {
		changed := prune(reg)
		var others []Claim
		for _, c := range reg.Instances {
			if c.DataDir == req.DataDir {
				out = c
			} else {
				others = append(others, c)
			}
		}
		if out.DataDir != "" {
			if err := sameChoice(out, req, reqPool); err != nil {
				return changed, err
			}
			if out.SandboxUIDBase == 0 {
				base, err := chooseSandboxUIDs(others)
				if err != nil {
					return changed, err
				}
				out.SandboxUIDBase = base
				for i := range reg.Instances {
					if reg.Instances[i].DataDir == out.DataDir {
						reg.Instances[i].SandboxUIDBase = base
					}
				}
				changed = true
			}
			return changed, nil
		}
		c, err := r.choose(req, reqPool, others)
		if err != nil {
			return changed, err
		}
		reg.Instances = append(reg.Instances, c)
		out = c
		return true, nil
	})
	return out, err
}

// sameChoice checks that an instance restarting with explicit settings asks for what it holds:
// its sandboxes still use those.
func sameChoice(c Claim, req Request, pool netip.Prefix) error {
	hint := "its sandboxes still use the old value: delete them (or run corral up --cleanup) before changing it"
	if req.Tag != "" && req.Tag != c.Tag {
		return errdefs.Conflict("data dir %s holds net tag %q, not %q: %s", c.DataDir, c.Tag, req.Tag, hint)
	}
	if pool.IsValid() && pool.String() != c.Pool {
		return errdefs.Conflict("data dir %s holds net pool %s, not %s: %s", c.DataDir, c.Pool, pool, hint)
	}
	if req.CgroupParent != "" && req.CgroupParent != c.CgroupParent {
		return errdefs.Conflict("data dir %s holds cgroup parent %s, not %s: %s", c.DataDir, c.CgroupParent, req.CgroupParent, hint)
	}
	return nil
}

// choose makes a new claim for req beside others.
func (r *Registry) choose(req Request, pool netip.Prefix, others []Claim) (Claim, error) {
	c := Claim{DataDir: req.DataDir, Since: time.Now().UTC().Truncate(time.Second)}
	deflt := req.DataDir == DefaultDataDir
	held := func(what string, match func(o Claim) bool) error {
		for _, o := range others {
			if match(o) {
				return errdefs.Conflict("another Corral (data dir %s) holds it: choose another --%s, or leave it unset and one is chosen", o.DataDir, what)
			}
		}
		return nil
	}
	// Tag.
	switch {
	case req.Tag != "":
		if err := held("net-tag", func(o Claim) bool { return o.Tag == req.Tag }); err != nil {
			return c, fmt.Errorf("net tag %q: %w", req.Tag, err)
		}
		c.Tag = req.Tag
	default:
		if deflt && held("net-tag", func(o Claim) bool { return o.Tag == "0" }) == nil {
			c.Tag = "0"
			break
		}
		for i := 1; c.Tag == ""; i++ {
			t := strconv.FormatInt(int64(i), 36)
			if len(t) > 4 {
				return c, fmt.Errorf("%s: no free network tag on this host: %w", "net-tag", errdefs.ErrExhausted)
			}
			if held("net-tag", func(o Claim) bool { return o.Tag == t }) == nil {
				c.Tag = t
			}
		}
	}
	// Pool.
	overlaps := func(p netip.Prefix) func(o Claim) bool {
		return func(o Claim) bool {
			op, err := netip.ParsePrefix(o.Pool)
			return err == nil && op.Overlaps(p)
		}
	}
	switch {
	case pool.IsValid():
		if err := held("net-pool", overlaps(pool)); err != nil {
			return c, fmt.Errorf("net pool %s: %w", pool, err)
		}
		c.Pool = pool.String()
	default:
		host := r.hostAddrs()
		onHost := func(p netip.Prefix) bool {
			for _, h := range host {
				if h.Overlaps(p) {
					return true
				}
			}
			return false
		}
		first := netip.MustParsePrefix("10.200.0.0/16")
		if deflt && held("net-pool", overlaps(first)) == nil && !onHost(first) {
			c.Pool = first.String()
			break
		}
		for b := poolFirst + 1; b <= poolLast && c.Pool == ""; b++ {
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(b), 0, 0}), 16)
			if held("net-pool", overlaps(p)) == nil && !onHost(p) {
				c.Pool = p.String()
			}
		}
		if c.Pool == "" && held("net-pool", overlaps(first)) == nil && !onHost(first) {
			c.Pool = first.String()
		}
		if c.Pool == "" {
			return c, fmt.Errorf("%s: no free /16 in 10.200.0.0-10.249.255.255 on this host: pass --net-pool: %w", "net-pool", errdefs.ErrExhausted)
		}
	}
	// NFLOG group: derived from the tag as before (stable across restarts), moved on when taken.
	g := uint16(logGroupFirst + crc32.ChecksumIEEE([]byte(c.Tag))%(logGroupLast-logGroupFirst+1))
	for n := 0; ; n++ {
		if n > logGroupLast-logGroupFirst {
			return c, fmt.Errorf("%s: no free NFLOG group: %w", "log-group", errdefs.ErrExhausted)
		}
		gg := g
		if held("log-group", func(o Claim) bool { return o.LogGroup == gg }) == nil {
			c.LogGroup = g
			break
		}
		g++
		if g > logGroupLast {
			g = logGroupFirst
		}
	}
	// Cgroup parent.
	switch {
	case req.CgroupParent != "":
		if err := held("cgroup-parent", func(o Claim) bool { return cgroupNested(o.CgroupParent, req.CgroupParent) }); err != nil {
			return c, fmt.Errorf("cgroup parent %s: %w", req.CgroupParent, err)
		}
		c.CgroupParent = req.CgroupParent
	case deflt && held("cgroup-parent", func(o Claim) bool { return cgroupNested(o.CgroupParent, "/corral") }) == nil:
		c.CgroupParent = "/corral"
	default:
		cg := "/corral-" + c.Tag
		if err := held("cgroup-parent", func(o Claim) bool { return cgroupNested(o.CgroupParent, cg) }); err != nil {
			return c, fmt.Errorf("cgroup parent %s: %w", cg, err)
		}
		c.CgroupParent = cg
	}
	// VM uids: the historical range for the default data dir, the next free one otherwise.
	for i := uint32(0); i < vmUIDSlots; i++ {
		if i == 0 && !deflt {
			continue
		}
		base := VMUIDBase + i*VMUIDCount
		if held("vm-uids", func(o Claim) bool { return o.VMUIDBase == base }) == nil {
			c.VMUIDBase = base
			break
		}
	}
	if c.VMUIDBase == 0 {
		return c, fmt.Errorf("%s: no free range of VM uids on this host: %w", "vm-uids", errdefs.ErrExhausted)
	}
	base, err := chooseSandboxUIDs(others)
	if err != nil {
		return c, err
	}
	c.SandboxUIDBase = base
	return c, nil
}

// chooseSandboxUIDs returns the first sandbox uid range no other instance holds.
func chooseSandboxUIDs(others []Claim) (uint32, error) {
	for i := uint32(0); i < sandboxUIDClaims; i++ {
		base := SandboxUIDBase + i*SandboxUIDSize*SandboxUIDSlots
		if !slices.ContainsFunc(others, func(o Claim) bool { return o.SandboxUIDBase == base }) {
			return base, nil
		}
	}
	return 0, fmt.Errorf("%s: no free range of sandbox uids on this host (%d instances hold one): %w", "sandbox-uids", sandboxUIDClaims, errdefs.ErrExhausted)
}

// cgroupNested reports whether one cgroup path is the other or below it: either would let one
// instance see the other's sandboxes as its own.
func cgroupNested(a, b string) bool {
	a, b = strings.TrimSuffix(a, "/"), strings.TrimSuffix(b, "/")
	return a == b || strings.HasPrefix(a, b+"/") || strings.HasPrefix(b, a+"/") || a == "" || b == ""
}

// prune drops claims whose data dir is gone.
func prune(reg *file) bool {
	kept := reg.Instances[:0]
	for _, c := range reg.Instances {
		if _, err := os.Stat(c.DataDir); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		kept = append(kept, c)
	}
	changed := len(kept) != len(reg.Instances)
	reg.Instances = kept
	return changed
}

// Release removes dataDir's claim (after everything of it was removed from the host).
func (r *Registry) Release(dataDir string) error {
	return r.locked(func(reg *file) (bool, error) {
		for i, c := range reg.Instances {
			if c.DataDir == dataDir {
				reg.Instances = append(reg.Instances[:i], reg.Instances[i+1:]...)
				return true, nil
			}
		}
		return false, nil
	})
}

// List returns every claim.
func (r *Registry) List() ([]Claim, error) {
	var out []Claim
	err := r.locked(func(reg *file) (bool, error) {
		changed := prune(reg)
		out = append(out, reg.Instances...)
		return changed, nil
	})
	return out, err
}

// hostPrefixes returns the IPv4 networks of this host's interfaces.
func hostPrefixes() []netip.Prefix {
	var out []netip.Prefix
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && !p.Addr().IsLoopback() {
			out = append(out, p.Masked())
		}
	}
	return out
}
