package vmguest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/vmlink"
)

// MachineFwCfg is the fw_cfg item that carries a vm sandbox's MachineConfig as JSON
// (QEMU: -fw_cfg name=opt/corral/machine,file=...).
const MachineFwCfg = "opt/corral/machine"

// MachineConfig is what the host tells corral-agent in a vm sandbox (a full machine booted from
// its own disk, where the agent is a service of the guest's init, not the init).
type MachineConfig struct {
	Hostname string   `json:"hostname"`
	Env      []string `json:"env"`
	// AgentArgs are the serve arguments, as Config.AgentArgs.
	AgentArgs []string `json:"agent_args"`
	OpenFiles uint64   `json:"open_files"`
	Net       *Net     `json:"net,omitempty"`
	// ResolvConf is written to /etc/resolv.conf when set.
	ResolvConf string `json:"resolv_conf,omitempty"`
}

// Validate reports the first field that is out of range.
func (c *MachineConfig) Validate() error {
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
	if c.OpenFiles > maxOpenFiles {
		return errdefs.Invalid("open_files", "%d is more than %d", c.OpenFiles, maxOpenFiles)
	}
	if len(c.ResolvConf) > maxResolvConf {
		return errdefs.Invalid("resolv_conf", "%d bytes, at most %d", len(c.ResolvConf), maxResolvConf)
	}
	if c.Net != nil {
		return c.Net.validate()
	}
	return nil
}

// machineWait bounds the waits for the config item and the port: the agent starts once udev
// has seen its disk, and the rest of the machine's devices come up around the same time.
const machineWait = 60 * time.Second

// Machine runs corral-agent as the service of a vm sandbox's guest (`corral-agent vm`, started
// by the image's corral-agent.service; internal/vmimage/build.sh). It reads the MachineConfig from
// fw_cfg (the qemu_fw_cfg module must be loaded; the unit loads it), sets the hostname, the
// network interface and /etc/resolv.conf, and serves the agent on the virtio-serial port
// PortName until it fails. Commands run as the machine's root with every capability: in this
// tier the machine, not a container, is the sandbox. It runs again after every restart of the
// service (each step is idempotent).
func Machine(agent Agent) error {
	b, err := readFwCfg("/sys/firmware/qemu_fw_cfg/by_name/"+MachineFwCfg+"/raw", machineWait)
	if err != nil {
		return err
	}
	var c MachineConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return fmt.Errorf("decode config: %w", err)
	}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	args := c.AgentArgs
	if len(args) == 0 {
		args = []string{"serve"}
	}
	serve, _, err := agent(args)
	if err != nil {
		return fmt.Errorf("agent arguments %q: %w", args, err)
	}
	if err := unix.Sethostname([]byte(c.Hostname)); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	if err := setupNetwork(c.Net, machineWait); err != nil {
		return err
	}
	if c.ResolvConf != "" {
		if err := writeEtcFile("/etc/resolv.conf", c.ResolvConf); err != nil {
			return err
		}
	}
	if c.OpenFiles > 0 {
		rl := syscall.Rlimit{Cur: c.OpenFiles, Max: c.OpenFiles}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			return fmt.Errorf("set RLIMIT_NOFILE: %w", err)
		}
	}
	open, err := pinPort(vmlink.PortDevice, PortName, machineWait)
	if err != nil {
		return err
	}
	setEnv(c.Env)
	return serve(context.Background(), vmlink.Listen(open, nil))
}

// readFwCfg waits up to timeout for the fw_cfg file at path (qemu_fw_cfg probes it
// asynchronously) and returns its content (at most maxConfig bytes).
func readFwCfg(path string, timeout time.Duration) ([]byte, error) {
	deadline := time.Now().Add(timeout)
	for {
		_, err := os.Stat(path)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
			return nil, fmt.Errorf("read config %s (is qemu_fw_cfg loaded?): %w", path, err)
		}
		time.Sleep(pollInterval)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfig+1))
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	if len(b) > maxConfig {
		return nil, fmt.Errorf("read config: more than %d bytes", maxConfig)
	}
	return b, nil
}
