package e2e

import (
	"context"
	"encoding/json"
	"github.com/corral-dev/corral/internal/hostreg"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// needMicroVM skips unless QEMU and the guest kernel are installed (scripts/setup.sh does both).
func needMicroVM(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("needs qemu-system-x86_64 (scripts/setup.sh installs it)")
	}
	if _, err := os.Stat("/var/cache/corral/guest-kernel/current/vmlinuz"); err != nil {
		t.Skip("needs the guest kernel in /var/cache/corral/guest-kernel/current (scripts/guest-kernel.sh)")
	}
}

// qemuPids returns the pids of QEMU processes running a VM of sandbox id.
func qemuPids(id string) []int { return qemuProcs("\x00corral-" + id + "\x00") }

// instanceQEMUPids returns the pids of QEMU processes running as one of p's VM uids: its own,
// not another Corral's on the same host.
func instanceQEMUPids(p *corralProc) []int {
	var out []int
	for _, pid := range qemuProcs("") {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" {
				uid, _ := strconv.ParseUint(f[1], 10, 32)
				if uint32(uid) >= p.VMUIDBase && uint32(uid)-p.VMUIDBase < hostreg.VMUIDCount {
					out = append(out, pid)
				}
			}
		}
	}
	return out
}

func qemuProcs(match string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 2 && strings.HasSuffix(args[0], "qemu-system-x86_64") && strings.Contains(string(b), match) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestMicroVM runs the microvm tier through the CLI shapes of its acceptance checks: create with
// --tier microvm, exec, cp, pause (the QEMU process ends), resume (a running program goes on),
// a restart of corral (the VM outlives it), rm, and nothing left behind.
func TestMicroVM(t *testing.T) {
	needMicroVM(t)
	p := withBase(t)
	ctx := context.Background()

	out, errOut, code := p.cli("", "create", "--tier", "microvm", "--base", "base:test", "--cpus", "1", "--memory", "256M", "--disk", "1G", "--env", "GREETING=hi", "-o", "json")
	if code != 0 {
		t.Fatalf("create --tier microvm: exit %d: %s\n%s", code, errOut, out)
	}
	var sb corral.Sandbox
	if err := json.Unmarshal([]byte(out), &sb); err != nil {
		t.Fatalf("create -o json: %v\n%s", err, out)
	}
	t.Cleanup(func() { p.Client.DeleteSandbox(context.Background(), sb.ID) })
	if sb.Tier != "microvm" || sb.Runtime != "qemu" || (sb.Accelerator != "tcg" && sb.Accelerator != "kvm") || sb.State != corral.StateRunning {
		t.Fatalf("created %+v: want tier microvm, runtime qemu, accelerator kvm or tcg, running", sb)
	}
	if got, err := p.Client.GetSandbox(ctx, sb.ID); err != nil || got.Accelerator != sb.Accelerator {
		t.Fatalf("get: %+v, %v; want accelerator %s", got, err, sb.Accelerator)
	}
	if len(qemuPids(sb.ID)) != 1 {
		t.Fatalf("want one QEMU process for %s, got %v", sb.ID, qemuPids(sb.ID))
	}

	// Its own kernel: the Debian cloud kernel, not the host's.
	host, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	out, errOut, code = p.cli("", "exec", sb.ID, "--", "uname", "-r")
	if code != 0 || !strings.Contains(out, "cloud-amd64") || strings.TrimSpace(out) == strings.TrimSpace(string(host)) {
		t.Fatalf("uname -r in the VM = %q (exit %d, %s); want the guest's cloud kernel, not the host's %s", out, code, errOut, host)
	}
	// stdout, stderr, exit codes, env, cwd, stdin, a tty: as in a container.
	out, errOut, code = p.cli("", "exec", sb.ID, "--cwd", "/tmp", "--", "sh", "-c", `echo "$GREETING $(pwd) $(hostname)"; echo oops >&2; exit 5`)
	if out != "hi /tmp "+sb.ID+"\n" || errOut != "oops\n" || code != 5 {
		t.Fatalf("exec = %q / %q / %d", out, errOut, code)
	}
	if out, _, code = p.cli("hello\n", "exec", "-i", sb.ID, "--", "cat"); out != "hello\n" || code != 0 {
		t.Fatalf("stdin: %q %d", out, code)
	}
	if out, _, code = p.cli("", "exec", "--tty", sb.ID, "--", "tty"); !strings.HasPrefix(out, "/dev/pts/") || code != 0 {
		t.Fatalf("tty: %q %d", out, code)
	}
	// Commands get the container tier's capabilities, not the guest init's.
	if out := p.sh(sb.ID, "grep CapBnd /proc/self/status"); !strings.Contains(out, "00000000a80405fb") {
		t.Fatalf("capability bounding set in the VM: %q; want the sandbox set", out)
	}
	// Files both ways.
	local := t.TempDir()
	os.WriteFile(filepath.Join(local, "in.txt"), []byte("payload\n"), 0o644)
	if _, errOut, code := p.cli("", "cp", filepath.Join(local, "in.txt"), sb.ID+":/root/in.txt"); code != 0 {
		t.Fatalf("cp in: %s", errOut)
	}
	if _, errOut, code := p.cli("", "cp", sb.ID+":/root/in.txt", filepath.Join(local, "out.txt")); code != 0 {
		t.Fatalf("cp out: %s", errOut)
	}
	if b, _ := os.ReadFile(filepath.Join(local, "out.txt")); string(b) != "payload\n" {
		t.Fatalf("cp round trip = %q", b)
	}
	// The writable disk is the VM's own and size-limited.
	if out := p.sh(sb.ID, "df -k / | tail -1 | awk '{print $2}'"); out == "" {
		t.Fatalf("df in the VM printed nothing")
	} else if kb, _ := strconv.Atoi(strings.TrimSpace(out)); kb <= 0 || kb > 1<<20 {
		t.Fatalf("the VM's root is %s KiB; want at most the 1 GiB disk", out)
	}

	// A program that keeps running, and a file: both survive pause and resume.
	p.sh(sb.ID, "echo kept > /root/state; (i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done) >/dev/null 2>&1 &")
	time.Sleep(time.Second)
	before, _ := strconv.Atoi(strings.TrimSpace(p.sh(sb.ID, "cat /tmp/count")))
	if before < 1 {
		t.Fatalf("the counter does not run")
	}
	if _, errOut, code := p.cli("", "pause", sb.ID); code != 0 {
		t.Fatalf("pause: %s", errOut)
	}
	got, err := p.Client.GetSandbox(ctx, sb.ID)
	if err != nil || got.State != corral.StatePaused || got.LastPause == nil || got.LastPause.MemoryReturned <= 0 {
		t.Fatalf("after pause: %+v, %v; want paused with memory returned", got, err)
	}
	if pids := qemuPids(sb.ID); len(pids) != 0 {
		t.Fatalf("a paused VM still has QEMU processes %v", pids)
	}
	if _, errOut, code := p.cli("", "resume", sb.ID); code != 0 {
		t.Fatalf("resume: %s", errOut)
	}
	if out := p.sh(sb.ID, "cat /root/state"); out != "kept\n" {
		t.Fatalf("file after resume = %q", out)
	}
	eventually(t, 10*time.Second, "the counter goes on after resume", func() bool {
		n, _ := strconv.Atoi(strings.TrimSpace(p.sh(sb.ID, "cat /tmp/count")))
		return n > before
	})
	// Transparent resume: a data-plane call wakes a paused VM.
	if _, errOut, code := p.cli("", "pause", sb.ID); code != 0 {
		t.Fatalf("second pause: %s", errOut)
	}
	if out := p.sh(sb.ID, "cat /root/state"); out != "kept\n" {
		t.Fatalf("exec on a paused VM = %q", out)
	}

	// The VM outlives a kill -9 of corral and is served again after the restart.
	p.Kill9()
	p.Restart()
	if out := p.sh(sb.ID, "cat /root/state"); out != "kept\n" {
		t.Fatalf("after a restart of corral: %q", out)
	}

	// rm leaves nothing: no QEMU, no state directory.
	if _, errOut, code := p.cli("", "rm", sb.ID); code != 0 {
		t.Fatalf("rm: %s", errOut)
	}
	eventually(t, 10*time.Second, "no QEMU process after rm", func() bool { return len(qemuPids(sb.ID)) == 0 })
	// rm answers once the sandbox is deleting; its cleanup finishes behind it.
	eventually(t, time.Minute, "the VM's directory to go after rm", func() bool {
		_, err := os.Stat(filepath.Join(p.DataDir, "vms", sb.ID))
		return os.IsNotExist(err)
	})

	// Bad input is refused clearly.
	if _, errOut, code := p.cli("", "create", "--tier", "microvm", "--base", "base:test", "--memory", "64M"); code == 0 || !strings.Contains(errOut, "128 MiB") {
		t.Fatalf("a 64 MiB VM: exit %d, %q; want a refusal naming the 128 MiB minimum", code, errOut)
	}
	if _, errOut, code := p.cli("", "create", "--tier", "microvm", "--base", "base:test", "--runtime", "gvisor"); code == 0 || !strings.Contains(errOut, "qemu") {
		t.Fatalf("microvm on gvisor: exit %d, %q", code, errOut)
	}
	info, err := p.Client.Info(ctx)
	if err != nil || info.MicroVMAccelerator == "" || !strings.Contains(strings.Join(info.Tiers, ","), "microvm") {
		t.Fatalf("info: %+v, %v; want the microvm tier and its accelerator", info, err)
	}
}

// TestMicroVMNetworkAndTTL: a VM's traffic leaves through its sandbox's network namespace (the
// egress policy applies; its address is the sandbox's), and a TTL ends the VM.
func TestMicroVMNetworkAndTTL(t *testing.T) {
	needMicroVM(t)
	p := withBase(t)
	ctx := context.Background()
	sb := p.create(corral.CreateRequest{Tier: "microvm", Limits: corral.Limits{MemoryBytes: 256 << 20}, TTL: "20s",
		Network: &corral.NetworkPolicy{Mode: corral.NetworkAllowlist}})
	if sb.NetworkAddress == "" {
		t.Fatalf("a networked VM has no address: %+v", sb)
	}
	if out := p.sh(sb.ID, "ip -4 addr show eth0"); !strings.Contains(out, sb.NetworkAddress+"/30") {
		t.Fatalf("the guest's eth0 = %q; want %s/30", out, sb.NetworkAddress)
	}
	// Nothing of the harness is reachable: not corral's API through the gateway (the host).
	_, port, _ := strings.Cut(p.Listen, ":")
	if out := p.sh(sb.ID, "gw=$(ip route | awk '/default/ {print $3}'); nc -z -w 2 $gw "+port+" && echo reached || echo refused"); !strings.Contains(out, "refused") {
		t.Fatalf("the VM reached corral's API port %s through its gateway: %q", port, out)
	}
	// Default deny: a connection to an address no rule allows is blocked and counted.
	p.sh(sb.ID, "nc -w 2 203.0.113.9 80 </dev/null; true")
	eventually(t, 10*time.Second, "the blocked attempt is counted", func() bool {
		got, err := p.Client.GetSandbox(ctx, sb.ID)
		return err == nil && got.Egress != nil && got.Egress.BlockedTotal > 0
	})
	eventually(t, 60*time.Second, "the TTL ends the VM", func() bool {
		got, err := p.Client.GetSandbox(ctx, sb.ID)
		return err == nil && got.State == corral.StateStopped && len(qemuPids(sb.ID)) == 0
	})
}

// TestMicroVMTemplates: for an environment saved with --microvm-template, the first VM of a
// shape boots and builds the shape's template; later ones are restored from it, each with its own
// hostname, address, clock and entropy, and behave like booted ones (exec, files, pause and
// resume, delete). A VM of the same shape not from that environment still boots.
// (corral up --microvm-templates enables templates for every VM; bench microvm --templates.)
func TestMicroVMTemplates(t *testing.T) {
	needMicroVM(t)
	p := withBase(t)
	ctx := context.Background()
	if _, stderr, code := p.cli("", "env", "create", "vmt", "--base", "base:test", "--microvm-template"); code != 0 {
		t.Fatalf("env create --microvm-template: %s", stderr)
	}
	req := corral.CreateRequest{Tier: "microvm", Environment: "vmt", Limits: corral.Limits{MemoryBytes: 256 << 20, DiskBytes: 256 << 20},
		Network: &corral.NetworkPolicy{Mode: corral.NetworkAllowlist}}
	first := p.create(req)
	if first.Boot != "boot" {
		t.Fatalf("the first VM of its shape: boot = %q, want boot", first.Boot)
	}
	var clones []*corral.Sandbox
	eventually(t, 90*time.Second, "a VM restored from the template", func() bool {
		sb := p.create(req)
		if sb.Boot == "template" {
			clones = append(clones, sb)
			return true
		}
		p.Client.DeleteSandbox(ctx, sb.ID)
		return false
	})
	clones = append(clones, p.create(req))
	if clones[1].Boot != "template" {
		t.Fatalf("second restore: boot = %q", clones[1].Boot)
	}
	seen := map[string]bool{}
	for _, sb := range clones {
		out := p.sh(sb.ID, "hostname; ip -4 addr show eth0 | grep -o 'inet [0-9./]*'; date +%s; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; echo data > /root/f; cat /root/f")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 5 || lines[0] != sb.ID || lines[1] != "inet "+sb.NetworkAddress+"/30" || lines[4] != "data" {
			t.Fatalf("restored VM %s: %q; want its own hostname and address, and a writable disk", sb.ID, out)
		}
		if at, _ := strconv.ParseInt(lines[2], 10, 64); time.Since(time.Unix(at, 0)).Abs() > 30*time.Second {
			t.Fatalf("restored VM %s: clock %s, host %d", sb.ID, lines[2], time.Now().Unix())
		}
		if seen[lines[3]] {
			t.Fatalf("two VMs restored from one template read the same random bytes %s", lines[3])
		}
		seen[lines[3]] = true
	}
	plain := req
	plain.Environment, plain.Base = "", "base:test"
	if other := p.create(plain); other.Boot != "boot" {
		t.Fatalf("a VM of the same shape from no template environment: boot = %q, want boot", other.Boot)
	} else {
		clones = append(clones, other)
	}
	sb := clones[0]
	if _, err := p.Client.PauseSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if out := p.sh(sb.ID, "cat /root/f"); out != "data\n" {
		t.Fatalf("after pause and resume: %q", out)
	}
	for _, s := range append(clones, first) {
		if _, err := p.Client.DeleteSandbox(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
	}
	p.Stop()
	assertNoLeftovers(t, p)
}
