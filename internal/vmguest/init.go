// Package vmguest is the init of a microvm sandbox: corral-agent, run by the guest kernel as
// /init of the initramfs (internal/guestimage builds it), prepares the VM and then serves the
// agent on the virtio-serial port (internal/vmlink).
//
// Init runs these phases, as PID 1 and root with every capability, without udev or any other
// program:
//
//  1. mount /proc, /sys and /dev (devtmpfs) of the initramfs;
//  2. load the kernel modules listed in /lib/modules/order (virtio, erofs, overlay, fw_cfg, ...)
//     but the disk and network drivers;
//  3. read the Config the host put in the fw_cfg item ConfigFwCfg (waiting for it to appear); a
//     template's (Config.Template) says to wait for the real one on the port instead, where the
//     host snapshots the VM (receiveConfig in template.go); set the clock and seed the entropy
//     pool from the Config; load the disk and network drivers, which so probe the devices of the
//     VM that runs, never a template's;
//  4. set the hostname; bring up lo and the network interface (Config.Net);
//  5. find the disks by their virtio-blk serials, mount each layer's EROFS image read-only, the
//     writable ext4 disk, and the overlay of them at /newroot;
//  6. open the virtio-serial port PortName (before the switch: the sandbox's /dev has no node
//     for it);
//  7. switch the root to /newroot (the initramfs's files are deleted);
//  8. give the root what a container sandbox's root has (internal/runtime/runc/spec.go): /proc,
//     a tmpfs /dev with the standard nodes, /dev/pts, /dev/shm, /dev/mqueue, a read-only /sys,
//     the masked and read-only paths, /etc/resolv.conf; put the agent into the cgroup "sandbox"
//     with its pids.max, shown read-only at /sys/fs/cgroup; set RLIMIT_NOFILE;
//  9. drop every thread's capabilities to the commands' set (agentrpc.SandboxCaps), set
//     no_new_privs, and set the environment from Config.Env;
//  10. serve the agent on vmlink.Listen of the port.
//
// The agent is PID 1, so it reaps every orphan of the VM (agentrpc's reaper waits for any child
// while it serves, as it does as PID 1 of a container). Debug output goes to the console
// (ttyS0) only when the kernel command line has corral.debug; otherwise Init prints nothing but
// a fatal error, after which it powers the VM off, so the host sees QEMU exit rather than hang.
package vmguest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/vmlink"
)

// Agent parses corral-agent's serve arguments (Config.AgentArgs, "serve" first) and returns
// the function that serves the agent on a listener until it fails, and whether the agent runs
// fncalls (serve --calls), which keeps CAP_SYS_ADMIN. Init calls it before it changes anything,
// so a bad argument fails the boot at once.
type Agent func(args []string) (serve func(ctx context.Context, ln net.Listener) error, calls bool, err error)

// Paths and bounds of the guest.
const (
	modulesDir  = "/lib/modules"
	fwCfgPath   = "/sys/firmware/qemu_fw_cfg/by_name/" + ConfigFwCfg + "/raw"
	configWait  = 5 * time.Second
	deviceWait  = 10 * time.Second
	maxConfig   = 1 << 20
	rootDir     = "/newroot"
	runDir      = "/run"
	debugOption = "corral.debug"
)

// Init runs the guest (see the package documentation) and serves the agent agent describes. It
// does not return while the agent serves. When preparing fails or the agent stops, it prints the
// error to the console and powers the VM off; it returns the error only if even that fails (PID 1
// returning from main then panics the kernel, which, with panic=-1 and QEMU's -no-reboot, also
// ends QEMU).
func Init(agent Agent) error {
	g := &guest{start: time.Now()}
	err := g.run(agent)
	if err == nil {
		err = errors.New("the agent stopped serving")
	}
	g.printf("corral-init: fatal: %v", err)
	unix.Sync()
	if rerr := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); rerr != nil {
		g.printf("corral-init: power off: %v", rerr)
	}
	return err
}

// guest is the state of Init.
type guest struct {
	start   time.Time
	console *os.File // nil until opened
	debug   bool
}

// printf writes a line to the console.
func (g *guest) printf(format string, args ...any) {
	w := io.Writer(os.Stderr)
	if g.console != nil {
		w = g.console
	}
	fmt.Fprintf(w, format+"\n", args...)
}

// phase reports a finished phase on the console when debugging.
func (g *guest) phase(what string) {
	if g.debug {
		g.printf("corral-init: %6dms %s", time.Since(g.start).Milliseconds(), what)
	}
}

func (g *guest) run(agent Agent) error {
	if err := mountEarly(); err != nil {
		return err
	}
	if f, err := os.OpenFile("/dev/console", os.O_WRONLY|unix.O_NOCTTY, 0); err == nil {
		g.console = f
	}
	if b, err := os.ReadFile("/proc/cmdline"); err == nil {
		g.debug = slices.Contains(strings.Fields(string(b)), debugOption)
	}
	g.phase("mounted /proc, /sys, /dev")

	// The disk and network drivers load once the config is known: a template VM is snapshotted
	// before, so a VM restored from it probes its own disks and network card, not the template's.
	if err := loadModules(modulesDir, func(name string) bool { return !lateModules[name] }); err != nil {
		return err
	}
	g.phase("loaded modules")

	c, err := readConfig(fwCfgPath, configWait)
	if err != nil {
		return err
	}
	var open func() (io.ReadWriteCloser, error)
	if c.Template {
		if open, err = pinPort(vmlink.PortDevice, PortName, deviceWait); err != nil {
			return err
		}
		g.phase("template: waiting for the sandbox's config")
		if c, err = receiveConfig(open); err != nil {
			return err
		}
	}
	if err := applyHostState(c); err != nil {
		return err
	}
	if err := loadModules(modulesDir, func(name string) bool { return lateModules[name] }); err != nil {
		return err
	}
	serve, calls, err := agent(c.agentArgs())
	if err != nil {
		return fmt.Errorf("agent arguments %q: %w", c.agentArgs(), err)
	}
	keep := commandCaps(calls)
	g.phase("read the config")

	if err := unix.Sethostname([]byte(c.Hostname)); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	if err := setupNetwork(c.Net, deviceWait); err != nil {
		return err
	}
	g.phase("network up")

	disks, err := findDisks("/sys/block", c.serials(), deviceWait)
	if err != nil {
		return err
	}
	if err := mountRoot(c, disks, runDir, rootDir); err != nil {
		return err
	}
	g.phase("mounted the root")

	if open == nil {
		if open, err = pinPort(vmlink.PortDevice, PortName, deviceWait); err != nil {
			return err
		}
	}
	g.phase("opened the port")

	if err := switchRoot(rootDir); err != nil {
		return err
	}
	if err := setupSandbox(c); err != nil {
		return err
	}
	if c.OpenFiles > 0 {
		// syscall's Setrlimit (not x/sys's) also stops the Go runtime from restoring, in
		// children, the soft limit it had raised at start.
		rl := syscall.Rlimit{Cur: c.OpenFiles, Max: c.OpenFiles}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			return fmt.Errorf("set RLIMIT_NOFILE: %w", err)
		}
	}
	g.phase("prepared the sandbox's root")

	if err := denyIOURing(); err != nil {
		return err
	}
	if err := dropCaps(keep); err != nil {
		return err
	}
	setEnv(c.Env)
	g.phase("dropped capabilities; serving")
	return serve(context.Background(), vmlink.Listen(open, nil))
}

// mountEarly mounts what the initramfs needs: /proc, /sys and /dev.
func mountEarly() error {
	for _, m := range []mountSpec{
		{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NOEXEC | unix.MS_NODEV, ""},
		{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NOEXEC | unix.MS_NODEV, ""},
		{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
	} {
		os.MkdirAll(m.target, 0o755)
		if err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.target, err)
		}
	}
	return nil
}

// lateModules load after the config is read: the drivers of the disks and the network card.
var lateModules = map[string]bool{"virtio_blk": true, "virtio_net": true}

// loadModules loads dir/<name>.ko for each name in dir/order that want accepts, in order
// (dependencies first). A module already loaded (or built in) is fine.
func loadModules(dir string, want func(name string) bool) error {
	order, err := os.ReadFile(filepath.Join(dir, "order"))
	if errors.Is(err, os.ErrNotExist) {
		return nil // a kernel with everything built in
	}
	if err != nil {
		return fmt.Errorf("load modules: %w", err)
	}
	for _, name := range strings.Fields(string(order)) {
		name = strings.TrimSuffix(name, ".ko")
		if strings.ContainsRune(name, '/') {
			return fmt.Errorf("load modules: %q in %s/order is not a module name", name, dir)
		}
		if !want(name) {
			continue
		}
		f, err := os.Open(filepath.Join(dir, name+".ko"))
		if err != nil {
			return fmt.Errorf("load module %s: %w", name, err)
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", name, err)
		}
	}
	return nil
}

// readConfig waits up to timeout for the fw_cfg file at path (qemu_fw_cfg probes it
// asynchronously), then reads and validates the Config in it.
func readConfig(path string, timeout time.Duration) (*Config, error) {
	b, err := readFwCfg(path, timeout)
	if err != nil {
		return nil, err
	}
	return parseConfig(b)
}

// parseConfig decodes and validates a Config.
func parseConfig(b []byte) (*Config, error) {
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("decode config: %w", err)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return &c, nil
}

// pinPort waits up to timeout for the virtio-serial port name (find returns its device node),
// opens it, and returns the open function for vmlink.Listen: its first call returns that open
// port; a later one (after the port failed) opens the device again through an O_PATH descriptor
// taken now, since after the switch of root no path leads to the initramfs's /dev.
func pinPort(find func(string) (string, error), name string, timeout time.Duration) (func() (io.ReadWriteCloser, error), error) {
	deadline := time.Now().Add(timeout)
	var path string
	for {
		var err error
		if path, err = find(name); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("virtio-serial port %s: %w", name, err)
		}
		time.Sleep(pollInterval)
	}
	pin, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("virtio-serial port %s: open %s: %w", name, path, err)
	}
	first, err := vmlink.OpenDevice(path)
	if err != nil {
		unix.Close(pin)
		return nil, fmt.Errorf("virtio-serial port %s: %w", name, err)
	}
	reopen := "/proc/self/fd/" + strconv.Itoa(pin)
	return func() (io.ReadWriteCloser, error) {
		if first != nil {
			f := first
			first = nil // Listen calls open from one goroutine
			return f, nil
		}
		return vmlink.OpenDevice(reopen)
	}, nil
}

// setEnv replaces the process's environment (what the kernel gave init) with env and the defaults.
func setEnv(env []string) {
	os.Clearenv()
	for _, e := range agentrpc.DefaultEnv(env) {
		k, v, _ := strings.Cut(e, "=")
		os.Setenv(k, v)
	}
}
