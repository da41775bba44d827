package vmguest

import (
	"fmt"
	"net"
	"net/netip"
	"path"
	"slices"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lazyregexp"
)

// ConfigFwCfg is the fw_cfg item that carries the guest's Config as JSON
// (QEMU: -fw_cfg name=opt/corral/config,file=...).
const ConfigFwCfg = "opt/corral/config"

// PortName is the virtio-serial port the agent serves on (QEMU: virtserialport,name=...).
const PortName = "corral.ctl"

// Config is what the host tells the guest's init, as JSON in the ConfigFwCfg item.
type Config struct {
	// Hostname is set with sethostname.
	Hostname string `json:"hostname"`
	// Env is KEY=VALUE, the agent's environment, which commands inherit. PATH and HOME get
	// defaults unless set here (as in a container sandbox).
	Env []string `json:"env"`
	// AgentArgs are corral-agent's arguments, "serve" and its flags, e.g.
	// ["serve","--retain-exited","64"]; never --fd, --listen or --resume-marker (the agent
	// serves on the virtio-serial port). Empty means ["serve"].
	AgentArgs []string `json:"agent_args"`
	// Layers are the image's layers, bottom (base) first.
	Layers []Layer `json:"layers"`
	// UpperSerial is the virtio-blk serial of the writable disk, already ext4-formatted by the host.
	UpperSerial string `json:"upper_serial"`
	// Pids is the sandbox's pids.max; 0 means no limit.
	Pids int64 `json:"pids"`
	// OpenFiles is RLIMIT_NOFILE (soft and hard) of the agent and so of commands; 0 leaves the
	// kernel's default.
	OpenFiles uint64 `json:"open_files"`
	// ShmBytes is the size of /dev/shm; 0 means DefaultShmBytes.
	ShmBytes int64 `json:"shm_bytes"`
	// Net configures the VM's network interface; nil: loopback only.
	Net *Net `json:"net,omitempty"`
	// ResolvConf is written to /etc/resolv.conf in the sandbox's root when set.
	ResolvConf string `json:"resolv_conf,omitempty"`
	// Volumes are ext4 disks mounted into the sandbox's root at their paths, each on a
	// virtio-blk disk of its own (runc.Volume on the host).
	Volumes []Volume `json:"volumes,omitempty"`
	// Workdir, when set, is made in the sandbox's root if missing (owned by root, mode 0755):
	// the image's working directory, which commands start in.
	Workdir string `json:"workdir,omitempty"`

	// Template makes this VM a template (see the package documentation): it boots until the
	// sandbox's own Config is needed and then waits for it on the port (ReceiveConfig), where
	// the host snapshots it. Every other field is ignored.
	Template bool `json:"template,omitempty"`
	// Seed is randomness from the host that the guest adds to its entropy pool: VMs restored
	// from one template start with the same pool.
	Seed []byte `json:"seed,omitempty"`
	// Now is the host's clock (Unix nanoseconds) when it sent the Config: a VM restored from a
	// template starts with the template's clock.
	Now int64 `json:"now,omitempty"`
}

// The lines of the exchange by which a template VM receives its Config on the port: the guest
// writes ConfigReady (again after every reconnection) and reads; the host writes
// "CORRAL-CONFIG <nonce> <base64 JSON>\n" and waits for "CORRAL-CONFIG-OK <nonce>\n".
const (
	ConfigReady    = "CORRAL-READY"
	ConfigPrefix   = "CORRAL-CONFIG "
	ConfigOKPrefix = "CORRAL-CONFIG-OK "
)

// Layer is one read-only layer: an EROFS image on a virtio-blk disk.
type Layer struct {
	// Serial is the virtio-blk serial of the EROFS image's disk.
	Serial string `json:"serial"`
	// Devices are the serials of the image's extra devices (its data blobs), in the order the
	// image's device table lists them; they are passed to erofs as device=.
	Devices []string `json:"devices,omitempty"`
}

// Volume is a volume's disk and where it is mounted.
type Volume struct {
	// Serial is the virtio-blk serial of the volume's disk.
	Serial string `json:"serial"`
	// Path is an absolute path in the sandbox; no symlink on the way to it is followed.
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// Net configures the one network interface.
type Net struct {
	// MAC picks the interface.
	MAC string `json:"mac"`
	// Address is the interface's address with its prefix length (CIDR), e.g. 10.0.0.2/30.
	Address string `json:"address"`
	// Gateway is the default route's next hop.
	Gateway string `json:"gateway"`
	// MTU, when set, is the interface's MTU.
	MTU int `json:"mtu,omitempty"`
}

// DefaultShmBytes is the size of /dev/shm when Config.ShmBytes is 0.
const DefaultShmBytes = 64 << 20

// Limits of Validate.
const (
	// maxSerial is what a virtio-blk serial can hold (VIRTIO_BLK_ID_BYTES).
	maxSerial = 20
	// maxLayers: the overlay's lowerdir must fit in one page of mount data, and QEMU's microvm
	// offers 24 virtio devices (docs/microvm-notes.md §4; plan for 16).
	maxLayers = 64
	// maxResolvConf bounds ResolvConf.
	maxResolvConf = 64 << 10
	// maxOpenFiles is the kernel's default fs.nr_open, the most RLIMIT_NOFILE may be.
	maxOpenFiles = 1 << 20
)

var (
	hostnameRE = lazyregexp.New(`^[A-Za-z0-9]([A-Za-z0-9.-]{0,61}[A-Za-z0-9])?$`)
	serialRE   = lazyregexp.New(`^[A-Za-z0-9_.-]+$`)
)

// Validate reports the first field that is out of range.
func (c *Config) Validate() error {
	if c.Template {
		return nil
	}
	if len(c.Seed) > 512 {
		return errdefs.Invalid("seed", "%d bytes, at most 512", len(c.Seed))
	}
	if !hostnameRE.MatchString(c.Hostname) {
		return errdefs.Invalid("hostname", "%q is not a valid hostname", c.Hostname)
	}
	for _, e := range c.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" || strings.ContainsRune(e, 0) {
			return errdefs.Invalid("env", "%q is not KEY=VALUE", e)
		}
	}
	if err := checkAgentArgs(c.AgentArgs); err != nil {
		return err
	}
	if len(c.Layers) == 0 {
		return errdefs.Invalid("layers", "at least one layer is needed")
	}
	if len(c.Layers) > maxLayers {
		return errdefs.Invalid("layers", "%d layers, at most %d", len(c.Layers), maxLayers)
	}
	seen := map[string]bool{}
	serial := func(field, s string) error {
		if len(s) > maxSerial || !serialRE.MatchString(s) {
			return errdefs.Invalid(field, "%q: want 1-%d of [A-Za-z0-9_.-]", s, maxSerial)
		}
		if seen[s] {
			return errdefs.Invalid(field, "serial %q is used twice", s)
		}
		seen[s] = true
		return nil
	}
	for i, l := range c.Layers {
		if err := serial(fmt.Sprintf("layers[%d].serial", i), l.Serial); err != nil {
			return err
		}
		for j, d := range l.Devices {
			if err := serial(fmt.Sprintf("layers[%d].devices[%d]", i, j), d); err != nil {
				return err
			}
		}
	}
	if err := serial("upper_serial", c.UpperSerial); err != nil {
		return err
	}
	for i, v := range c.Volumes {
		if err := serial(fmt.Sprintf("volumes[%d].serial", i), v.Serial); err != nil {
			return err
		}
		if !path.IsAbs(v.Path) || path.Clean(v.Path) != v.Path || v.Path == "/" {
			return errdefs.Invalid(fmt.Sprintf("volumes[%d].path", i), "%q is not a clean absolute path other than /", v.Path)
		}
	}
	if c.Workdir != "" && !path.IsAbs(c.Workdir) {
		return errdefs.Invalid("workdir", "%q is not an absolute path", c.Workdir)
	}
	switch {
	case c.Pids < 0:
		return errdefs.Invalid("pids", "must not be negative")
	case c.ShmBytes < 0:
		return errdefs.Invalid("shm_bytes", "must not be negative")
	case c.OpenFiles > maxOpenFiles:
		return errdefs.Invalid("open_files", "%d is more than %d", c.OpenFiles, maxOpenFiles)
	case len(c.ResolvConf) > maxResolvConf:
		return errdefs.Invalid("resolv_conf", "%d bytes, at most %d", len(c.ResolvConf), maxResolvConf)
	}
	if c.Net != nil {
		if err := c.Net.validate(); err != nil {
			return err
		}
	}
	return nil
}

// checkAgentArgs accepts "serve" and its flags, but none that names another channel.
func checkAgentArgs(args []string) error {
	if len(args) == 0 {
		return nil
	}
	if args[0] != "serve" {
		return errdefs.Invalid("agent_args", "must start with \"serve\", got %q", args[0])
	}
	for _, a := range args[1:] {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && slices.Contains([]string{"fd", "listen", "resume-marker"}, name) {
			return errdefs.Invalid("agent_args", "%s: the guest's agent serves on its virtio-serial port only", a)
		}
	}
	return nil
}

func (n *Net) validate() error {
	if _, err := net.ParseMAC(n.MAC); err != nil {
		return errdefs.Invalid("net.mac", "%q: %v", n.MAC, err)
	}
	p, err := netip.ParsePrefix(n.Address)
	if err != nil {
		return errdefs.Invalid("net.address", "%q is not an address with a prefix length", n.Address)
	}
	gw, err := netip.ParseAddr(n.Gateway)
	if err != nil {
		return errdefs.Invalid("net.gateway", "%q is not an IP address", n.Gateway)
	}
	if gw.Is4() != p.Addr().Is4() {
		return errdefs.Invalid("net.gateway", "%s and the address %s are not of the same family", n.Gateway, n.Address)
	}
	if n.MTU != 0 && (n.MTU < 68 || n.MTU > 65535) {
		return errdefs.Invalid("net.mtu", "%d is outside [68, 65535]", n.MTU)
	}
	return nil
}

// agentArgs returns AgentArgs, defaulted.
func (c *Config) agentArgs() []string {
	if len(c.AgentArgs) == 0 {
		return []string{"serve"}
	}
	return c.AgentArgs
}

// serials lists every disk serial the guest waits for.
func (c *Config) serials() []string {
	var s []string
	for _, l := range c.Layers {
		s = append(s, l.Serial)
		s = append(s, l.Devices...)
	}
	s = append(s, c.UpperSerial)
	for _, v := range c.Volumes {
		s = append(s, v.Serial)
	}
	return s
}
