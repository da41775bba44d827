package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"image"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// needVM skips unless QEMU, qemu-img and debootstrap are installed (scripts/setup.sh installs
// them); the image is built once per machine (corral vm-image build caches it).
func needVM(t *testing.T) {
	t.Helper()
	needMicroVM(t)
	for _, c := range []string{"qemu-img", "debootstrap"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("needs %s (scripts/setup.sh installs it)", c)
		}
	}
}

// screenPixels decodes a PNG screenshot.
func screenPixels(t *testing.T, b []byte) image.Image {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("the screenshot is not a PNG: %v", err)
	}
	return img
}

// colours counts the distinct colours of img (up to 16).
func colours(img image.Image) int {
	seen := map[[4]uint32]bool{}
	r := img.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y += 2 {
		for x := r.Min.X; x < r.Max.X; x++ {
			cr, cg, cb, ca := img.At(x, y).RGBA()
			seen[[4]uint32{cr, cg, cb, ca}] = true
			if len(seen) >= 16 {
				return len(seen)
			}
		}
	}
	return len(seen)
}

// samePixels reports whether two screenshots are the same picture.
func samePixels(a, b image.Image) bool {
	if a.Bounds() != b.Bounds() {
		return false
	}
	r := a.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if a.At(x, y) != b.At(x, y) {
				return false
			}
		}
	}
	return true
}

// mouseProbe records the guest's USB tablet events (type code value, one a line) in /tmp/mouse.
const mouseProbe = `import glob, os, struct
dev = None
for d in glob.glob('/sys/class/input/event*'):
    if 'Tablet' in open(d + '/device/name').read():
        dev = '/dev/input/' + os.path.basename(d)
f = open(dev, 'rb')  # before saying so: the tablet is polled only while it is open
out = open('/tmp/mouse', 'a')
out.write('device %s\n' % dev)
out.flush()
while True:
    _, _, typ, code, val = struct.unpack('llHHi', f.read(24))
    if typ in (1, 3):
        out.write('%d %d %d\n' % (typ, code, val))
        out.flush()
`

// TestVM runs the vm tier through the CLI shapes of its acceptance checks: vm-image build, create
// --tier vm --image, screen, type, key, click, exec and cp through the agent, pause and resume
// (a running program goes on), power off and on (the disk stays), a power-off from inside, rm, and
// nothing left behind. The project's Debian image boots under TCG here.
func TestVM(t *testing.T) {
	needVM(t)
	p := startCorral(t)
	ctx := context.Background()

	// The project's image: built once per machine (cached), then published as a layer.
	if out, errOut, code := p.cli("", "vm-image", "build", "vmimg:test"); code != 0 || !strings.Contains(out, "vmimg:test vm-image sha256:") {
		t.Fatalf("vm-image build: exit %d: %s\n%s", code, errOut, out)
	}
	out, errOut, code := p.cli("", "create", "--tier", "vm", "--image", "vmimg:test", "--cpus", "2", "--memory", "1G", "--net", "allowlist", "--env", "GREETING=hi", "-o", "json")
	if code != 0 {
		t.Fatalf("create --tier vm: exit %d: %s\n%s", code, errOut, out)
	}
	var sb corral.Sandbox
	if err := json.Unmarshal([]byte(out), &sb); err != nil {
		t.Fatalf("create -o json: %v\n%s", err, out)
	}
	t.Cleanup(func() { p.Client.DeleteSandbox(context.Background(), sb.ID) })
	if sb.Tier != "vm" || sb.Runtime != "qemu" || sb.Image != "vmimg:test" || (sb.Accelerator != "tcg" && sb.Accelerator != "kvm") || sb.State != corral.StateRunning {
		t.Fatalf("created %+v: want tier vm, runtime qemu, image vmimg:test, an accelerator, running", sb)
	}
	if len(qemuPids(sb.ID)) != 1 {
		t.Fatalf("want one QEMU process for %s, got %v", sb.ID, qemuPids(sb.ID))
	}
	// The screen answers while the machine boots, before any agent.
	shots := t.TempDir()
	shot := func(name string) image.Image {
		t.Helper()
		f := filepath.Join(shots, name)
		if _, errOut, code := p.cli("", "screen", sb.ID, "-o", f); code != 0 {
			t.Fatalf("screen: exit %d: %s", code, errOut)
		}
		b, _ := os.ReadFile(f)
		return screenPixels(t, b)
	}
	shot("boot.png")

	// Commands and files go through the agent the image starts (the first call waits for it).
	out, errOut, code = p.cli("", "exec", sb.ID, "--", "sh", "-c", `cat /etc/corral-vm-image; echo "$GREETING $(hostname) $(id -u)"; uname -r`)
	if code != 0 || !strings.Contains(out, "recipe=") || !strings.Contains(out, "hi "+sb.ID+" 0\n") {
		t.Fatalf("exec in the vm: exit %d: %q %s", code, out, errOut)
	}
	if host, _ := os.ReadFile("/proc/sys/kernel/osrelease"); strings.Contains(out, strings.TrimSpace(string(host))) {
		t.Fatalf("the vm runs the host's kernel: %s", out)
	}
	if ip := p.sh(sb.ID, "ip -4 -o addr show scope global"); !strings.Contains(ip, sb.NetworkAddress+"/30") {
		t.Fatalf("the vm's address = %q; want %s/30", ip, sb.NetworkAddress)
	}
	local := t.TempDir()
	os.WriteFile(filepath.Join(local, "in.txt"), []byte("payload\n"), 0o644)
	if _, errOut, code := p.cli("", "cp", filepath.Join(local, "in.txt"), sb.ID+":/root/in.txt"); code != 0 {
		t.Fatalf("cp in: %s", errOut)
	}
	if out := p.sh(sb.ID, "cat /root/in.txt"); out != "payload\n" {
		t.Fatalf("cp round trip = %q", out)
	}

	// The screen shows tty1's root shell (not blank); typed text reaches it and changes the screen.
	eventually(t, 2*time.Minute, "a shell on tty1", func() bool {
		out, _, code := p.cli("", "exec", sb.ID, "--", "pgrep", "-t", "tty1", "-x", "bash")
		return code == 0 && strings.TrimSpace(out) != ""
	})
	time.Sleep(2 * time.Second) // the prompt is drawn after bash starts
	before := shot("before.png")
	if n := colours(before); n < 2 {
		t.Fatalf("the screenshot is blank (%d colour)", n)
	}
	if _, errOut, code := p.cli("", "type", sb.ID, "echo typed-by-corral: $((6*7)) > /tmp/typed"); code != 0 {
		t.Fatalf("type: %s", errOut)
	}
	if _, errOut, code := p.cli("", "key", sb.ID, "ret"); code != 0 {
		t.Fatalf("key ret: %s", errOut)
	}
	eventually(t, time.Minute, "the typed command ran in the guest", func() bool {
		out, _, _ := p.cli("", "exec", sb.ID, "--", "cat", "/tmp/typed")
		return out == "typed-by-corral: 42\n"
	})
	after := shot("after.png")
	if samePixels(before, after) {
		t.Fatalf("the screen did not change after typing")
	}
	// A key combination: ctrl+u clears what was typed since (bash's line editing).
	p.cli("", "type", sb.ID, "echo not-this > /tmp/typed2")
	p.cli("", "key", sb.ID, "ctrl+u")
	p.cli("", "type", sb.ID, "echo this > /tmp/typed2", "--enter")
	eventually(t, time.Minute, "the line after ctrl+u ran", func() bool {
		out, _, _ := p.cli("", "exec", sb.ID, "--", "cat", "/tmp/typed2")
		return out == "this\n"
	})
	if _, errOut, code := p.cli("", "key", sb.ID, "hyper+x"); code == 0 || !strings.Contains(errOut, "unknown key") {
		t.Errorf("key hyper+x: exit %d, %q; want an unknown key refused", code, errOut)
	}
	// A click reaches the guest's tablet at the right place.
	if _, errOut, code := p.cliIn("", mouseProbe, "exec", "-i", sb.ID, "--", "sh", "-c", "cat > /tmp/mouse.py"); code != 0 {
		t.Fatalf("write the mouse probe: %s", errOut)
	}
	p.sh(sb.ID, "nohup python3 /tmp/mouse.py >/tmp/mouse.err 2>&1 &")
	eventually(t, time.Minute, "the mouse probe opened the tablet", func() bool {
		out, _, _ := p.cli("", "exec", sb.ID, "--", "cat", "/tmp/mouse")
		return strings.HasPrefix(out, "device /dev/input/event")
	})
	w, h := before.Bounds().Dx(), before.Bounds().Dy()
	if _, errOut, code := p.cli("", "click", sb.ID, strconv.Itoa(w/2), strconv.Itoa(h/4)); code != 0 {
		t.Fatalf("click: %s", errOut)
	}
	eventually(t, time.Minute, "the click reached the guest", func() bool {
		out, _, _ := p.cli("", "exec", sb.ID, "--", "cat", "/tmp/mouse")
		x := 0
		for _, l := range strings.Split(out, "\n") {
			if v, ok := strings.CutPrefix(l, "3 0 "); ok {
				x, _ = strconv.Atoi(v)
			}
		}
		return strings.Contains(out, "1 272 1\n") && strings.Contains(out, "1 272 0\n") && x > 16000 && x < 16800
	})

	// A running program and the screen survive pause (QEMU ends) and resume.
	p.sh(sb.ID, "(i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done) >/dev/null 2>&1 &")
	time.Sleep(time.Second)
	count, _ := strconv.Atoi(strings.TrimSpace(p.sh(sb.ID, "cat /tmp/count")))
	if _, errOut, code := p.cli("", "pause", sb.ID); code != 0 {
		t.Fatalf("pause: %s", errOut)
	}
	if got, err := p.Client.GetSandbox(ctx, sb.ID); err != nil || got.State != corral.StatePaused || len(qemuPids(sb.ID)) != 0 {
		t.Fatalf("after pause: %+v, %v, QEMU %v; want paused and no QEMU", got, err, qemuPids(sb.ID))
	}
	if _, errOut, code := p.cli("", "resume", sb.ID); code != 0 {
		t.Fatalf("resume: %s", errOut)
	}
	eventually(t, 30*time.Second, "the counter goes on after resume", func() bool {
		n, _ := strconv.Atoi(strings.TrimSpace(p.sh(sb.ID, "cat /tmp/count")))
		return n > count
	})
	if out := p.sh(sb.ID, "cat /tmp/typed"); out != "typed-by-corral: 42\n" {
		t.Fatalf("after resume: %q", out)
	}
	if img := shot("resumed.png"); colours(img) < 2 {
		t.Fatalf("the screen is blank after resume")
	}

	// A VNC view through the API: QEMU's RFB greeting, no password asked (the token was the check).
	vnc, err := p.Client.VNC(ctx, sb.ID)
	if err != nil {
		t.Fatalf("vnc: %v", err)
	}
	greet := make([]byte, 12)
	if _, err := io.ReadFull(vnc, greet); err != nil || string(greet) != "RFB 003.008\n" {
		t.Fatalf("vnc greeting = %q, %v", greet, err)
	}
	vnc.Write([]byte("RFB 003.008\n"))
	auth := make([]byte, 2)
	if _, err := io.ReadFull(vnc, auth); err != nil || auth[0] != 1 || auth[1] != 1 {
		t.Fatalf("vnc security types = %v, %v; want one, None", auth, err)
	}
	vnc.Close()

	// Power off (ACPI) ends QEMU and keeps the disk; calls are refused until power on.
	p.sh(sb.ID, "echo kept > /root/state; sync")
	if out, errOut, code := p.cli("", "power", sb.ID, "off"); code != 0 || !strings.Contains(out, "off") {
		t.Fatalf("power off: exit %d: %s %s", code, out, errOut)
	}
	if len(qemuPids(sb.ID)) != 0 {
		t.Fatalf("QEMU still runs after power off: %v", qemuPids(sb.ID))
	}
	// The guest shut down cleanly on the ACPI button (it was not ended after the grace period).
	if out, _, _ := p.cli("", "console", sb.ID); !strings.Contains(out, "reboot: Power down") {
		t.Fatalf("the guest did not power itself down on ACPI power-off; its console ends:\n%s", out[max(0, len(out)-2000):])
	}
	if _, errOut, code := p.cli("", "exec", sb.ID, "--", "true"); code == 0 || !strings.Contains(errOut, "powered off") {
		t.Fatalf("exec on a powered-off vm: exit %d, %q", code, errOut)
	}
	if _, errOut, code := p.cli("", "power", sb.ID, "on"); code != 0 {
		t.Fatalf("power on: %s", errOut)
	}
	// A second boot under TCG on a loaded 2-core host can outlast one exec's wait for the agent.
	eventually(t, 6*time.Minute, "the vm's agent after power on", func() bool {
		_, _, exit := p.run(sb.ID, "true")
		return exit != nil && exit.Code == 0
	})
	if out := p.sh(sb.ID, "cat /root/state; test -e /tmp/count || echo fresh-boot"); out != "kept\nfresh-boot\n" {
		t.Fatalf("after power on: %q; want the disk kept and a fresh boot", out)
	}
	// A guest that powers itself off leaves the sandbox off, not failed.
	p.run(sb.ID, "systemctl", "poweroff")
	eventually(t, 2*time.Minute, "the vm is off after its guest powered off", func() bool {
		got, err := p.Client.GetSandbox(ctx, sb.ID)
		return err == nil && got.State == corral.StateOff && len(qemuPids(sb.ID)) == 0
	})
	if out, _, _ := p.cli("", "console", sb.ID); !strings.Contains(out, "login:") {
		t.Fatalf("the serial console lacks the login prompt:\n%s", out)
	}

	// rm leaves nothing.
	if _, errOut, code := p.cli("", "rm", sb.ID); code != 0 {
		t.Fatalf("rm: %s", errOut)
	}
	// rm answers once the sandbox is deleting; its cleanup finishes behind it.
	eventually(t, time.Minute, "the vm's directory to go after rm", func() bool {
		_, err := os.Stat(filepath.Join(p.DataDir, "vms", sb.ID))
		return os.IsNotExist(err)
	})

	// Bad input is refused clearly.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"create", "--tier", "vm"}, "--image"},
		{[]string{"create", "--tier", "vm", "--image", "vmimg:nope"}, "not published"},
		{[]string{"create", "--base", "vmimg:test"}, "vm-image layer, not a base layer"},
		{[]string{"create", "--tier", "vm", "--image", "vmimg:test", "--memory", "128M"}, "256 MiB"},
		{[]string{"vnc", sb.ID, "--listen", "0.0.0.0:5999"}, "loopback"},
	} {
		if _, errOut, code := p.cli("", c.args...); code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("corral %v: exit %d, %q; want a refusal naming %q", c.args, code, errOut, c.want)
		}
	}
	info, err := p.Client.Info(ctx)
	if err != nil || !strings.Contains(strings.Join(info.Tiers, ","), "vm") {
		t.Fatalf("info: %+v, %v; want the vm tier", info, err)
	}
	p.Stop()
	assertNoLeftovers(t, p)
}
