package qemu

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime"
	"github.com/corral-dev/corral/internal/vmdisk"
	"github.com/corral-dev/corral/internal/vmguest"
)

// machineTCGCacheMiB is the TCG translation cache of a vm (a full distribution runs more code
// than a microvm's guest).
const machineTCGCacheMiB = 256

// MachineVM is runtime.Spec.Machine for the vm tier: a full q35 machine with firmware (SeaBIOS),
// booted from a disk image under a copy-on-write overlay of its own, with a standard VGA screen,
// a PS/2 keyboard and a USB tablet (absolute pointer). See the package doc.
const MachineVM = "vm"

// Bounds of the vm tier.
const (
	// MinMachineMemory: a full distribution's init needs more than a microvm's agent.
	MinMachineMemory = 256 << 20
	// AgentDiskSerial is the virtio-blk serial of the read-only disk that carries corral-agent
	// into the guest; the image's udev rule starts corral-agent.service when it appears.
	AgentDiskSerial = "corral-agent"
	// powerOffGrace is how long an ACPI power-off may take before the machine is ended.
	powerOffGrace = 60 * time.Second
)

// MachineAvailable is nil when vm sandboxes can be created here, else why not.
func (r *Runtime) MachineAvailable() error {
	if r.err != nil {
		return r.err
	}
	return r.machineErr
}

// probeMachine finds what the vm tier needs besides QEMU: qemu-img (for the overlays).
func (r *Runtime) probeMachine() error {
	q := r.cfg.QEMUImg
	if q == "" {
		q = "qemu-img"
	}
	p, err := exec.LookPath(q)
	if err != nil {
		return fmt.Errorf("qemu-img is not installed (Debian's qemu-utils; run scripts/setup.sh): %w", errdefs.ErrUnavailable)
	}
	r.cfg.QEMUImg = p
	return nil
}

func (r *Runtime) validateMachine(spec *runtime.Spec) error {
	if r.machineErr != nil {
		return r.machineErr
	}
	if spec.Calls || spec.Template {
		return errdefs.Invalid("Machine", "vm sandboxes run no fncalls and have no templates")
	}
	// A vm's disk is at least its image's, whatever DiskBytes asks (createMachine).
	if err := checkLimits(spec, MinMachineMemory, 1); err != nil {
		return err
	}
	if spec.Netns != "" && (!spec.Addr.Is4() || !spec.Gateway.Is4()) {
		return errdefs.Invalid("Addr", "a VM with a network namespace needs its IPv4 address and gateway")
	}
	return nil
}

// createMachine starts a vm sandbox: it returns once QEMU runs the machine, not when the guest
// has booted (an image without the agent still has its screen, input and console). WaitAgent
// waits for the agent.
func (r *Runtime) createMachine(ctx context.Context, spec runtime.Spec) (_ *runtime.Sandbox, err error) {
	info, err := vmdisk.Inspect(spec.BootDisk, spec.BootDiskFormat)
	if err != nil {
		return nil, err
	}
	// QEMU that hangs before its monitor answers ends the create rather than holding the
	// sandbox in "creating" (the boot itself is not waited for).
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	// The guest sees the image's disk, or a larger one when the spec asks for more (the
	// partitions stay as the image has them).
	size := max(info.VirtualBytes, spec.DiskBytes)
	id := spec.ID
	dir := r.dir(id)
	agentDisk, err := r.agentDisk(spec.AgentPath)
	if err != nil {
		return nil, err
	}
	uid, unlock, err := r.claim(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	defer func() {
		if err != nil {
			r.abandon(ctx, id)
		}
	}()
	overlay := filepath.Join(dir, "disk.qcow2")
	// No backing file in the overlay's header: QEMU gets the base as a node of its own.
	out, err := exec.CommandContext(ctx, r.cfg.QEMUImg, "create", "-q", "-f", "qcow2", "-o", "lazy_refcounts=on",
		overlay, strconv.FormatInt(size, 10)).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("create sandbox %s: qemu-img create: %v: %s", id, err, strings.TrimSpace(string(out)))
	}
	c := &vmguest.MachineConfig{Hostname: guestHostname(&spec), Env: spec.Env, AgentArgs: guestAgentArgs(spec.AgentArgs), OpenFiles: spec.OpenFiles}
	files := []vmFile{{Role: "disk-base", Path: spec.BootDisk, Serial: info.Format},
		{Role: "disk", Path: overlay}, {Role: "disk-ro", Path: overlay},
		{Role: "agent-disk", Path: agentDisk}}
	if spec.Netns != "" {
		files = append(files, vmFile{Role: "tap"})
		c.Net = &vmguest.Net{MAC: guestMAC, Address: spec.Addr.String() + "/30", Gateway: spec.Gateway.String()}
	}
	if c.ResolvConf, err = readResolvConf(&spec); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, "machine.json")
	b, _ := json.Marshal(c)
	// QEMU reopens it through /proc/self/fd as the VM's uid: that uid's alone (it holds the env).
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if err := os.Chown(cfgPath, int(uid), int(uid)); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	files = append(files, vmFile{Role: "machine-config", Path: cfgPath}, vmFile{Role: "console", Path: filepath.Join(dir, "console.log")},
		vmFile{Role: "qmp", Path: filepath.Join(dir, "qmp.sock")}, vmFile{Role: "ctl", Path: filepath.Join(dir, "ctl.sock")})
	st := &vmState{ID: id, UID: uid, Accel: r.accel, Files: files, Netns: spec.Netns, Since: time.Now().UTC(), CPUs: spec.CPUs, MemoryLimit: qemuMemoryLimit(spec.MemoryBytes, r.accel, machineTCGCacheMiB, 64<<20),
		Machine: MachineVM, FileLimit: max(size+size/8, spec.MemoryBytes+spec.MemoryBytes/256) + 64<<20}
	st.Args = r.machineArgs(&spec, files)
	if err := r.writeState(st); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if err := r.start(ctx, st, false); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if err := r.recordAccel(ctx, st); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w%s", id, err, r.qemuLogTail(id))
	}
	if _, err := r.proxy(id); err != nil {
		return nil, err
	}
	r.log.Info("vm started", "sandbox", id, "accel", st.Accel, "pid", st.Pid, "uid", st.UID, "disk", info.Format, "disk_bytes", size)
	return r.sandbox(st), nil
}

// machineArgs is QEMU's command line for a vm sandbox; files are the descriptors 3, 4, ... in
// order. Every disk is a -blockdev node on an fd set: QEMU opens no host path but its firmware.
func (r *Runtime) machineArgs(spec *runtime.Spec, files []vmFile) []string {
	cpus := max(int(math.Ceil(spec.CPUs)), 1)
	a := []string{"-name", "corral-" + spec.ID, "-M", "q35"}
	if r.accel == AccelKVM {
		a = append(a, "-accel", "kvm", "-cpu", "host")
	} else {
		// TCG's translation cache defaults to 1 GiB; a quarter of it keeps a full distribution
		// fast enough and QEMU's own memory bounded.
		a = append(a, "-accel", "tcg,thread=multi,tb-size="+strconv.Itoa(machineTCGCacheMiB))
	}
	a = append(a, "-m", strconv.FormatInt(spec.MemoryBytes>>20, 10), "-smp", strconv.Itoa(cpus),
		"-nodefaults", "-no-user-config", "-display", "none", "-vga", "std", "-vnc", "none",
		"-object", "rng-random,id=rng,filename=/dev/urandom", "-device", "virtio-rng-pci,rng=rng",
		"-device", "qemu-xhci,id=xhci", "-device", "usb-tablet,bus=xhci.0",
		"-device", "virtio-serial-pci,id=vser")
	node := func(v map[string]any) string {
		b, _ := json.Marshal(v)
		return string(b)
	}
	for i, f := range files {
		fd := strconv.Itoa(3 + i)
		self := "/proc/self/fd/" + fd
		set := strconv.Itoa(i + 1)
		switch f.Role {
		case "disk-base":
			a = append(a, "-add-fd", "fd="+fd+",set="+set,
				"-blockdev", node(map[string]any{"driver": "file", "node-name": "base-file", "filename": "/dev/fdset/" + set, "read-only": true, "locking": "off"}))
			base := map[string]any{"driver": f.Serial, "node-name": "base", "file": "base-file", "read-only": true}
			if f.Serial == vmdisk.QCOW2 {
				base["backing"] = nil // never a backing file the image names
			}
			a = append(a, "-blockdev", node(base))
		case "disk":
			// The read-only descriptor (disk-ro, next) joins this set: QEMU picks by access mode.
			a = append(a, "-add-fd", "fd="+fd+",set="+set,
				"-blockdev", node(map[string]any{"driver": "file", "node-name": "disk-file", "filename": "/dev/fdset/" + set, "locking": "off", "aio": "threads", "discard": "unmap"}),
				"-blockdev", node(map[string]any{"driver": "qcow2", "node-name": "disk", "file": "disk-file", "backing": "base", "discard": "unmap"}),
				"-device", "virtio-blk-pci,drive=disk,bootindex=1")
		case "disk-ro":
			a = append(a, "-add-fd", "fd="+fd+",set="+strconv.Itoa(i))
		case "agent-disk":
			a = append(a, "-add-fd", "fd="+fd+",set="+set,
				"-blockdev", node(map[string]any{"driver": "file", "node-name": "agent-file", "filename": "/dev/fdset/" + set, "read-only": true, "locking": "off"}),
				"-blockdev", node(map[string]any{"driver": "raw", "node-name": "agent", "file": "agent-file", "read-only": true}),
				"-device", "virtio-blk-pci,drive=agent,serial="+AgentDiskSerial)
		case "tap":
			// romfile=: no iPXE option ROM (the machine boots from its disk).
			a = append(a, "-netdev", "tap,id=net0,fd="+fd, "-device", "virtio-net-pci,netdev=net0,romfile=,mac="+guestMAC)
		case "machine-config":
			a = append(a, "-fw_cfg", "name="+vmguest.MachineFwCfg+",file="+self)
		case "console":
			a = append(a, "-chardev", "file,id=con,append=on,path="+self, "-serial", "chardev:con")
		case "qmp":
			a = append(a, "-chardev", "socket,id=qmp,fd="+fd+",server=on,wait=off", "-mon", "chardev=qmp,mode=control")
		case "ctl":
			a = append(a, "-chardev", "socket,id=ctl,fd="+fd+",server=on,wait=off",
				"-device", "virtserialport,bus=vser.0,chardev=ctl,name="+vmguest.PortName)
		}
	}
	return append(a, "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny")
}

// agentDisk returns the agent's disk for the vm tier: the static corral-agent binary padded
// with zeros to whole 4 KiB blocks (a block device's size), cached in CacheDir per binary. The
// guest copies it from the device and runs it; trailing zeros do not change an ELF program.
func (r *Runtime) agentDisk(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", errdefs.Invalid("AgentPath", "%s: %v", path, err)
	}
	name := fmt.Sprintf("agent-%x-%x-%x.img", st.Ino, st.Size, st.Mtim.Nano())
	out := filepath.Join(r.cfg.CacheDir, name)
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	src, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer src.Close()
	var elf [4]byte
	if _, err := io.ReadFull(src, elf[:]); err != nil || string(elf[:]) != "\x7fELF" {
		return "", errdefs.Invalid("AgentPath", "%s is not an ELF binary", path)
	}
	src.Seek(0, io.SeekStart)
	tmp, err := os.CreateTemp(r.cfg.CacheDir, ".agent-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	n, err := io.Copy(tmp, src)
	if err == nil {
		err = tmp.Truncate((n + 4095) &^ 4095)
	}
	if err == nil {
		err = tmp.Chmod(0o644) // read by the VMs' own uids, through a descriptor
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("agent disk: %w", err)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", err
	}
	// Older agents' disks that no VM names are removed at the next start (New).
	return out, nil
}

// machineExited is called when a vm's QEMU (started by this process) exits. A clean exit that
// nobody asked for is the guest powering itself off: the machine is then off, not failed.
func (r *Runtime) machineExited(id string, pid int, clean bool) {
	if !clean {
		return
	}
	unlock := r.lock(id)
	defer unlock()
	st, err := r.readState(id)
	if err != nil || st.Machine != MachineVM || st.Pid != pid || st.Paused {
		return // deleted, paused or powered off by the host: its state says so already
	}
	st.Pid, st.PidStart, st.Off = 0, 0, true
	if err := r.writeState(st); err != nil {
		r.log.Error("record a vm's power-off", "sandbox", id, "err", err)
		return
	}
	r.log.Info("vm powered off from inside", "sandbox", id)
}

// machineGone reports whether vm id is off, recording it off when its QEMU ended without a
// cause on record: a guest that powered itself off while no corral process watched QEMU (after
// a restart of corral), or a crash. The disk is the user's: an off vm keeps it, where a failed
// sandbox would be deleted. False while another call holds the VM (a create or a delete).
func (r *Runtime) machineGone(id string) bool {
	unlock, ok := r.tryLock(id)
	if !ok {
		return false
	}
	defer unlock()
	st, err := r.readState(id)
	if err != nil || st.Paused {
		return false
	}
	if st.Off {
		return true
	}
	if alive(st) {
		return false
	}
	st.Pid, st.PidStart, st.Off = 0, 0, true
	if err := r.writeState(st); err != nil {
		r.log.Error("record a vm whose QEMU ended as off", "sandbox", id, "err", err)
		return false
	}
	if f, err := os.OpenFile(filepath.Join(r.dir(id), "qemu.log"), os.O_WRONLY|os.O_APPEND|unix.O_CLOEXEC, 0); err == nil {
		fmt.Fprintf(f, "--- %s: QEMU ended with no cause on record (a guest power-off no corral watched, or a crash): the vm is off\n", time.Now().UTC().Format(time.RFC3339))
		f.Close()
	}
	r.log.Warn("a vm's QEMU ended with no cause on record; it is off (power on boots it again)", "sandbox", id)
	return true
}

// exitHandled waits (up to 5 s) until the exit of pid, a QEMU this process started, has been
// handled by machineExited; it returns at once for any other pid.
func (r *Runtime) exitHandled(pid int) {
	r.mu.Lock()
	ch := r.waits[pid]
	r.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
	}
}

// machineState reads a vm sandbox's state, refusing a microvm.
func (r *Runtime) machineState(id string) (*vmState, error) {
	if !idRE.MatchString(id) {
		return nil, errdefs.Invalid("ID", "%q is not a sandbox ID", id)
	}
	st, err := r.readState(id)
	if err != nil {
		return nil, err
	}
	if st.Machine != MachineVM {
		return nil, errdefs.Invalid("sandbox", "%s is a microvm: screen, input and power are for vm sandboxes", id)
	}
	return st, nil
}

// running returns the state of a vm that runs now (not paused, off or gone).
func (r *Runtime) running(id string) (*vmState, error) {
	st, err := r.machineState(id)
	if err != nil {
		return nil, err
	}
	switch {
	case st.Paused:
		return nil, errdefs.Conflict("sandbox %s is paused", id)
	case st.Off:
		return nil, errdefs.Conflict("sandbox %s is powered off (power it on first)", id)
	case !alive(st):
		return nil, errdefs.Conflict("sandbox %s is stopped", id)
	}
	return st, nil
}

// Screen returns a PNG screenshot of a vm sandbox's display, with its size.
func (r *Runtime) Screen(ctx context.Context, id string) (png []byte, width, height int, err error) {
	unlock := r.lock(id)
	defer unlock()
	if _, err := r.running(id); err != nil {
		return nil, 0, 0, err
	}
	q, err := dialQMP(ctx, filepath.Join(r.dir(id), "qmp.sock"))
	if err != nil {
		return nil, 0, 0, fmt.Errorf("screen of %s: %w", id, err)
	}
	defer q.Close()
	png, err = r.screendump(ctx, q, id)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("screen of %s: %w", id, err)
	}
	width, height, err = pngSize(png)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("screen of %s: %w", id, err)
	}
	return png, width, height, nil
}

// screendump has QEMU write a PNG of the display into an unnamed file of the VM's directory,
// passed as a descriptor (QMP add-fd; screendump to /dev/fdset/N), and returns its bytes.
func (r *Runtime) screendump(ctx context.Context, q *qmp, id string) ([]byte, error) {
	f, err := os.OpenFile(r.dir(id), os.O_RDWR|unix.O_TMPFILE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// QEMU takes from a set the descriptor of the access mode it opens with: write-only here.
	w, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(f.Fd())), os.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	// A set of its own each time (QEMU picks the id), removed after: a descriptor a failed
	// call left in some set can never be the one a later screenshot is written to.
	var added struct {
		Set int `json:"fdset-id"`
		FD  int `json:"fd"`
	}
	if err := q.runFD(ctx, "add-fd", nil, &added, int(w.Fd())); err != nil {
		return nil, err
	}
	defer q.run(context.WithoutCancel(ctx), "remove-fd", map[string]any{"fdset-id": added.Set}, nil)
	if err := q.run(ctx, "screendump", map[string]any{"filename": "/dev/fdset/" + strconv.Itoa(added.Set), "format": "png"}, nil); err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() > 64<<20 {
		return nil, fmt.Errorf("screenshot of %d bytes", fi.Size())
	}
	b := make([]byte, fi.Size())
	if _, err := f.ReadAt(b, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return b, nil
}

// pngSize reads the width and height of a PNG from its IHDR chunk.
func pngSize(b []byte) (int, int, error) {
	if len(b) < 24 || string(b[:8]) != "\x89PNG\r\n\x1a\n" || string(b[12:16]) != "IHDR" {
		return 0, 0, errors.New("QEMU wrote no PNG")
	}
	return int(binary.BigEndian.Uint32(b[16:])), int(binary.BigEndian.Uint32(b[20:])), nil
}

// screenSize is the display's size in pixels, which pointer events are scaled against.
type screenSize struct{ w, h int }

// Input sends keyboard and mouse events to a vm sandbox, in order. Mouse coordinates are screen
// pixels, scaled to the USB tablet's absolute axes against the display's current size.
func (r *Runtime) Input(ctx context.Context, id string, events []runtime.InputEvent) (runtime.InputResult, error) {
	return r.input(ctx, id, events)
}

func (r *Runtime) input(ctx context.Context, id string, events []runtime.InputEvent) (runtime.InputResult, error) {
	if err := checkInput(events); err != nil {
		return runtime.InputResult{}, err
	}
	unlock := r.lock(id)
	defer unlock()
	if _, err := r.running(id); err != nil {
		return runtime.InputResult{}, err
	}
	q, err := dialQMP(ctx, filepath.Join(r.dir(id), "qmp.sock"))
	if err != nil {
		return runtime.InputResult{}, fmt.Errorf("input to %s: %w", id, err)
	}
	defer q.Close()
	res := runtime.InputResult{}
	var size screenSize
	for _, e := range events {
		switch e.Type {
		case runtime.InputMove, runtime.InputClick, runtime.InputScroll, runtime.InputButton:
			if size.w == 0 {
				// The display's size now: a screenshot (the guest may have changed its mode).
				png, err := r.screendump(ctx, q, id)
				if err != nil {
					return res, fmt.Errorf("input to %s: the screen's size: %w", id, err)
				}
				w, h, err := pngSize(png)
				if err != nil {
					return res, fmt.Errorf("input to %s: %w", id, err)
				}
				size = screenSize{w, h}
				res.Width, res.Height = w, h
			}
		}
		if err := sendInput(ctx, q, e, size); err != nil {
			return res, fmt.Errorf("input to %s: event %d (%s): %w", id, res.Events, e.Type, err)
		}
		res.Events++
	}
	return res, nil
}

// Key pacing: how long a key stays down, and the gap after it. Keys are sent one event at a
// time from here (QMP input-send-event) rather than through QEMU's own key queue (send-key),
// which holds 1024 entries and drops what does not fit: a long text would lose keys, or leave
// Shift down. So events also stay in order with pointer events, and Input returns once every key
// has reached the keyboard controller.
const (
	keyHold = 10 * time.Millisecond
	keyGap  = 10 * time.Millisecond
)

// sendInput sends one event.
func sendInput(ctx context.Context, q *qmp, e runtime.InputEvent, size screenSize) error {
	pause := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	events := func(ev ...map[string]any) error {
		return q.run(ctx, "input-send-event", map[string]any{"events": ev}, nil)
	}
	key := func(code string, down bool) map[string]any {
		return map[string]any{"type": "key", "data": map[string]any{"down": down, "key": map[string]string{"type": "qcode", "data": code}}}
	}
	// sendKeys presses keys in order, holds them, and releases them in reverse.
	sendKeys := func(keys []string) error {
		for _, k := range keys {
			if err := events(key(k, true)); err != nil {
				return err
			}
		}
		if err := pause(keyHold); err != nil {
			return err
		}
		for i := len(keys) - 1; i >= 0; i-- {
			if err := events(key(keys[i], false)); err != nil {
				return err
			}
		}
		return pause(keyGap)
	}
	move := func() error {
		return events(
			map[string]any{"type": "abs", "data": map[string]any{"axis": "x", "value": absAxis(e.X, size.w)}},
			map[string]any{"type": "abs", "data": map[string]any{"axis": "y", "value": absAxis(e.Y, size.h)}})
	}
	button := func(name string, down bool) error {
		return events(map[string]any{"type": "btn", "data": map[string]any{"down": down, "button": name}})
	}
	switch e.Type {
	case runtime.InputText:
		keys, err := textKeys(e.Text)
		if err != nil {
			return err
		}
		for _, k := range keys {
			if err := sendKeys(k); err != nil {
				return err
			}
		}
		return nil
	case runtime.InputKey:
		keys, err := parseCombo(e.Key)
		if err != nil {
			return err
		}
		return sendKeys(keys)
	case runtime.InputMove:
		return move()
	case runtime.InputClick:
		if err := move(); err != nil {
			return err
		}
		for range max(e.Count, 1) {
			if err := button(buttons[e.Button], true); err != nil {
				return err
			}
			if err := button(buttons[e.Button], false); err != nil {
				return err
			}
		}
		return nil
	case runtime.InputScroll:
		if err := move(); err != nil {
			return err
		}
		wheel, n := "wheel-down", e.Delta
		if n < 0 {
			wheel, n = "wheel-up", -n
		}
		for range n {
			if err := button(wheel, true); err != nil {
				return err
			}
			if err := button(wheel, false); err != nil {
				return err
			}
		}
		return nil
	case runtime.InputButton:
		if err := move(); err != nil {
			return err
		}
		return button(buttons[e.Button], *e.Down)
	}
	return fmt.Errorf("unknown event type %q", e.Type)
}

// Power turns a vm sandbox's machine off (an ACPI power-off, ended after a grace period; force:
// at once), on (a fresh boot from its disk) or resets it (reboot).
func (r *Runtime) Power(ctx context.Context, id, action string, force bool) error {
	unlock := r.lock(id)
	defer unlock()
	st, err := r.machineState(id)
	if err != nil {
		return err
	}
	if st.Paused {
		return errdefs.Conflict("sandbox %s is paused: resume it first", id)
	}
	dir := r.dir(id)
	switch action {
	case runtime.PowerOn:
		if !st.Off && alive(st) {
			return errdefs.Conflict("sandbox %s is already on", id)
		}
		os.Remove(filepath.Join(dir, "qmp.sock"))
		os.Remove(filepath.Join(dir, "ctl.sock"))
		os.Remove(filepath.Join(dir, "frozen"))
		st.Off = false
		if err := r.start(ctx, st, false); err != nil {
			st.Off = true
			r.writeState(st)
			return fmt.Errorf("power on %s: %w", id, err)
		}
		r.log.Info("vm powered on", "sandbox", id, "pid", st.Pid)
		return nil
	case runtime.PowerOff, runtime.PowerReboot:
	default:
		return errdefs.Invalid("action", "%q: want on, off or reboot", action)
	}
	if st.Off || !alive(st) {
		return errdefs.Conflict("sandbox %s is not running", id)
	}
	q, err := dialQMP(ctx, filepath.Join(dir, "qmp.sock"))
	if err != nil {
		return fmt.Errorf("power %s %s: %w", action, id, err)
	}
	defer q.Close()
	if action == runtime.PowerReboot {
		if err := q.run(ctx, "system_reset", nil, nil); err != nil {
			return fmt.Errorf("reboot %s: %w", id, err)
		}
		os.Remove(filepath.Join(dir, "frozen"))
		r.log.Info("vm reset", "sandbox", id)
		return nil
	}
	how := "forced"
	if !force {
		how = "acpi"
		if err := q.run(ctx, "system_powerdown", nil, nil); err != nil {
			return fmt.Errorf("power off %s: %w", id, err)
		}
		deadline := time.Now().Add(powerOffGrace)
		for alive(st) && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
		}
		if alive(st) {
			how = "acpi, then ended after " + powerOffGrace.String()
		}
	}
	proc := *st
	st.Pid, st.PidStart, st.Off = 0, 0, true
	if err := r.writeState(st); err != nil {
		return err
	}
	if alive(&proc) {
		q.run(ctx, "quit", nil, nil)
	}
	if err := kill(context.WithoutCancel(ctx), &proc); err != nil {
		return err
	}
	os.Remove(filepath.Join(dir, "frozen"))
	r.log.Info("vm powered off", "sandbox", id, "how", how)
	return nil
}

// Console returns the end of a VM's serial console output (at most limit bytes): of console.log,
// preceded by console.log.1 (where capConsoles moved the earlier output) when that is short.
func (r *Runtime) Console(id string, limit int64) ([]byte, error) {
	if _, err := r.readState(id); err != nil {
		return nil, err
	}
	cur, err := fileEnd(filepath.Join(r.dir(id), "console.log"), limit)
	if err != nil {
		return nil, err
	}
	if int64(len(cur)) >= limit {
		return cur, nil
	}
	prev, err := fileEnd(filepath.Join(r.dir(id), "console.log.1"), limit-int64(len(cur)))
	if err != nil {
		return nil, err
	}
	return append(prev, cur...), nil
}

// fileEnd returns the last limit bytes of the file at path (none when it does not exist).
func fileEnd(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	off := max(fi.Size()-limit, 0)
	b := make([]byte, fi.Size()-off)
	n, err := f.ReadAt(b, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return b[:n], nil
}

// WaitAgent waits until a VM's agent answers, up to timeout: a vm sandbox's agent starts with
// the guest's services, some time after the machine.
func (r *Runtime) WaitAgent(ctx context.Context, id string, timeout time.Duration) error {
	if _, err := r.readState(id); err != nil {
		return err
	}
	if _, err := r.proxy(id); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := agentrpc.NewClient(filepath.Join(r.dir(id), agentSocket))
	for {
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.Ping(pctx)
		pcancel()
		if err == nil {
			return nil
		}
		switch st, _ := r.readState(id); {
		case st == nil:
			return errdefs.NotFound("sandbox %s was deleted while waiting for its agent", id)
		case st.Off:
			return errdefs.Conflict("sandbox %s was powered off before its agent answered", id)
		case st.Paused:
			return errdefs.Conflict("sandbox %s was paused before its agent answered", id)
		case !alive(st):
			return errdefs.Conflict("the QEMU of sandbox %s ended before its agent answered:%s", id, r.qemuLogTail(id))
		}
		if ctx.Err() != nil {
			return errdefs.Unavailable("the agent of vm %s did not answer within %s: the guest may still be booting, or its image does not start corral-agent (corral console %s shows its serial console)", id, timeout, id)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// VNC connects a new client to a vm sandbox's display: QEMU's VNC server (started without a
// listening socket, -vnc none) takes one end of a socket pair (QMP getfd, add_client), and the
// caller speaks RFB on the other. QEMU needs no address or port of the host for it; the API's
// authorization is the VNC server's (skipauth).
func (r *Runtime) VNC(ctx context.Context, id string) (net.Conn, error) {
	unlock := r.lock(id)
	defer unlock()
	if _, err := r.running(id); err != nil {
		return nil, err
	}
	q, err := dialQMP(ctx, filepath.Join(r.dir(id), "qmp.sock"))
	if err != nil {
		return nil, fmt.Errorf("vnc of %s: %w", id, err)
	}
	defer q.Close()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	ours := os.NewFile(uintptr(fds[0]), "vnc")
	defer ours.Close()
	theirs := os.NewFile(uintptr(fds[1]), "vnc-qemu")
	err = q.runFD(ctx, "getfd", map[string]string{"fdname": "vnc"}, nil, int(theirs.Fd()))
	theirs.Close()
	if err != nil {
		return nil, fmt.Errorf("vnc of %s: %w", id, err)
	}
	if err := q.run(ctx, "add_client", map[string]any{"protocol": "vnc", "fdname": "vnc", "skipauth": true}, nil); err != nil {
		return nil, fmt.Errorf("vnc of %s: %w", id, err)
	}
	return net.FileConn(ours)
}
