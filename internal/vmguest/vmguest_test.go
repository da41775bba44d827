package vmguest

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/doccheck"
	"github.com/corral-dev/corral/internal/errdefs"
)

func TestMain(m *testing.M) {
	if os.Getenv("VMGUEST_TEST_DROPCAPS") != "" {
		dropCapsChild()
		return
	}
	if os.Getenv("VMGUEST_TEST_CLAIM") != "" {
		claimChild()
		return
	}
	if os.Getenv("VMGUEST_TEST_IOURING") != "" {
		ioURingChild()
		return
	}
	os.Exit(m.Run())
}

func TestDocComments(t *testing.T) { doccheck.Exported(t, ".") }

func validConfig() Config {
	return Config{
		Hostname:    "sb-1",
		Env:         []string{"A=b", "EMPTY="},
		AgentArgs:   []string{"serve", "--retain-exited", "64"},
		Layers:      []Layer{{Serial: "l0"}, {Serial: "l1", Devices: []string{"l1d0", "l1d1"}}},
		UpperSerial: "upper",
		Pids:        100,
		OpenFiles:   1024,
		ShmBytes:    64 << 20,
		Net:         &Net{MAC: "52:54:00:12:34:56", Address: "10.0.0.2/30", Gateway: "10.0.0.1", MTU: 1400},
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tt := range []struct {
		name   string
		mutate func(*Config)
		field  string // "" for valid
	}{
		{"valid", func(*Config) {}, ""},
		{"no net, no args", func(c *Config) { c.Net, c.AgentArgs = nil, nil }, ""},
		{"hostname", func(c *Config) { c.Hostname = "a_b" }, "hostname"},
		{"empty hostname", func(c *Config) { c.Hostname = "" }, "hostname"},
		{"env", func(c *Config) { c.Env = []string{"NOEQUALS"} }, "env"},
		{"env key", func(c *Config) { c.Env = []string{"=x"} }, "env"},
		{"args", func(c *Config) { c.AgentArgs = []string{"version"} }, "agent_args"},
		{"fd", func(c *Config) { c.AgentArgs = []string{"serve", "--fd", "3"} }, "agent_args"},
		{"listen", func(c *Config) { c.AgentArgs = []string{"serve", "-listen=/x"} }, "agent_args"},
		{"marker", func(c *Config) { c.AgentArgs = []string{"serve", "--resume-marker", "/m"} }, "agent_args"},
		{"no layers", func(c *Config) { c.Layers = nil }, "layers"},
		{"serial", func(c *Config) { c.Layers[0].Serial = "a b" }, "layers[0].serial"},
		{"long serial", func(c *Config) { c.Layers[0].Serial = strings.Repeat("x", 21) }, "layers[0].serial"},
		{"device serial", func(c *Config) { c.Layers[1].Devices[1] = "" }, "layers[1].devices[1]"},
		{"duplicate", func(c *Config) { c.UpperSerial = "l1d0" }, "upper_serial"},
		{"no upper", func(c *Config) { c.UpperSerial = "" }, "upper_serial"},
		{"pids", func(c *Config) { c.Pids = -1 }, "pids"},
		{"shm", func(c *Config) { c.ShmBytes = -1 }, "shm_bytes"},
		{"open files", func(c *Config) { c.OpenFiles = 1<<20 + 1 }, "open_files"},
		{"mac", func(c *Config) { c.Net.MAC = "zz" }, "net.mac"},
		{"address", func(c *Config) { c.Net.Address = "10.0.0.2" }, "net.address"},
		{"gateway", func(c *Config) { c.Net.Gateway = "gw" }, "net.gateway"},
		{"family", func(c *Config) { c.Net.Gateway = "fe80::1" }, "net.gateway"},
		{"mtu", func(c *Config) { c.Net.MTU = 10 }, "net.mtu"},
		{"resolv.conf", func(c *Config) { c.ResolvConf = strings.Repeat("#", 65<<10) }, "resolv_conf"},
	} {
		c := validConfig()
		tt.mutate(&c)
		err := c.Validate()
		if tt.field == "" {
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			continue
		}
		if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Field(err) != tt.field {
			t.Errorf("%s: got %v (field %q), want an invalid %s", tt.name, err, errdefs.Field(err), tt.field)
		}
	}
}

func TestParseConfig(t *testing.T) {
	c, err := parseConfig([]byte(`{"hostname":"h","env":["A=1"],"agent_args":["serve"],
		"layers":[{"serial":"l0","devices":["l0d0"]}],"upper_serial":"upper","pids":5,
		"net":{"mac":"52:54:00:00:00:01","address":"10.1.0.2/30","gateway":"10.1.0.1"},
		"resolv_conf":"nameserver 10.1.0.1\n","future_field":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.serials(), []string{"l0", "l0d0", "upper"}; !slices.Equal(got, want) {
		t.Errorf("serials = %q, want %q", got, want)
	}
	if c.Net == nil || c.Net.Gateway != "10.1.0.1" || c.ResolvConf == "" {
		t.Errorf("decoded %+v", c)
	}
	if _, err := parseConfig([]byte(`{"hostname":"h"}`)); err == nil {
		t.Error("a config without layers is accepted")
	}
	if _, err := parseConfig([]byte(`{`)); err == nil {
		t.Error("bad JSON is accepted")
	}
}

func TestFindDisks(t *testing.T) {
	dir := t.TempDir()
	disk := func(name, serial string) {
		os.MkdirAll(filepath.Join(dir, name), 0o755)
		if serial != "" {
			os.WriteFile(filepath.Join(dir, name, "serial"), []byte(serial+"\n"), 0o644)
		}
	}
	disk("vda", "l0")
	disk("vdb", "") // still probing
	disk("sda", "upper")
	disk("loop0", "")
	go func() {
		time.Sleep(50 * time.Millisecond)
		disk("vdc", "upper")
	}()
	got, err := findDisks(dir, []string{"l0", "upper"}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got["l0"] != "/dev/vda" || got["upper"] != "/dev/vdc" || len(got) != 2 {
		t.Fatalf("findDisks = %v", got)
	}
	_, err = findDisks(dir, []string{"l0", "nope"}, 30*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("findDisks of a missing serial: %v", err)
	}
}

func TestOverlayData(t *testing.T) {
	got, err := overlayData([]string{"/run/l/0", "/run/l/1", "/run/l/2"}, "/run/upper/upper", "/run/upper/work")
	want := "lowerdir=/run/l/2:/run/l/1:/run/l/0,upperdir=/run/upper/upper,workdir=/run/upper/work"
	if err != nil || got != want {
		t.Fatalf("overlayData = %q, %v; want %q", got, err, want)
	}
	var many []string
	for i := range maxLayers {
		many = append(many, layerDir("/run/l", i))
	}
	if _, err := overlayData(many, "/run/upper/upper", "/run/upper/work"); err != nil {
		t.Errorf("%d layers: %v", maxLayers, err)
	}
	var long []string
	for i := range 200 {
		long = append(long, fmt.Sprintf("/run/a-long-layer-directory-name/%d", i))
	}
	if _, err := overlayData(long, "/u", "/w"); err == nil || !strings.Contains(err.Error(), "collapse") {
		t.Errorf("too many layers: %v", err)
	}
	if _, err := overlayData([]string{"/a:b"}, "/u", "/w"); err == nil {
		t.Error("a ':' in a layer directory is accepted")
	}
}

func TestErofsData(t *testing.T) {
	if got := erofsData(nil); got != "" {
		t.Errorf("no devices: %q", got)
	}
	if got := erofsData([]string{"/dev/vdb", "/dev/vdc"}); got != "device=/dev/vdb,device=/dev/vdc" {
		t.Errorf("two devices: %q", got)
	}
}

// TestReceiveConfig: a template VM's wait for its config skips what an earlier host left on the
// port, answers the config line with its nonce, starts over when the host goes away, and refuses
// a config that does not decode.
func TestReceiveConfig(t *testing.T) {
	good := Config{Hostname: "h", Layers: []Layer{{Serial: "l0"}}, UpperSerial: "upper", Now: 42}
	b, _ := json.Marshal(good)
	line := ConfigPrefix + "n1 " + base64.StdEncoding.EncodeToString(b) + "\n"
	ports := []*fakeConfigPort{
		{in: "junk from a session before\n"}, // EOF: the host left
		{in: "stale\n" + line},
	}
	i := 0
	c, err := receiveConfig(func() (io.ReadWriteCloser, error) {
		p := ports[i]
		i++
		return p, nil
	})
	if err != nil || c.Hostname != "h" || c.Now != 42 {
		t.Fatalf("receiveConfig = %+v, %v", c, err)
	}
	if ports[0].out.String() != ConfigReady+"\n" || ports[1].out.String() != ConfigReady+"\n"+ConfigOKPrefix+"n1\n" {
		t.Fatalf("the guest wrote %q then %q", ports[0].out.String(), ports[1].out.String())
	}
	if !ports[0].closed || !ports[1].closed {
		t.Fatalf("ports not closed")
	}
	_, err = receiveConfig(func() (io.ReadWriteCloser, error) {
		return &fakeConfigPort{in: ConfigPrefix + "n2 not-base64!\n"}, nil
	})
	if err == nil || !strings.Contains(err.Error(), "base64") {
		t.Fatalf("a bad config line: %v", err)
	}
}

type fakeConfigPort struct {
	in     string
	r      *strings.Reader
	out    bytes.Buffer
	closed bool
}

func (p *fakeConfigPort) Read(b []byte) (int, error) {
	if p.r == nil {
		p.r = strings.NewReader(p.in)
	}
	return p.r.Read(b)
}
func (p *fakeConfigPort) Write(b []byte) (int, error) { return p.out.Write(b) }
func (p *fakeConfigPort) Close() error                { p.closed = true; return nil }

func TestLoadModulesWithoutOrder(t *testing.T) {
	if err := loadModules(t.TempDir(), func(string) bool { return true }); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "order"), []byte("missing\n"), 0o644)
	if err := loadModules(dir, func(string) bool { return true }); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("a missing module: %v", err)
	}
}

func TestRemoveTree(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []string{"init", "lib/modules/a.ko", "lib/modules/order", "run/l/0/keep", "newroot/keep"} {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(dir, p), nil, 0o644)
	}
	os.Symlink("/etc", filepath.Join(dir, "link"))
	mounted := false
	if os.Geteuid() == 0 {
		// Mount points stand in for the sandbox's root and a layer.
		for _, m := range []string{"newroot", "run/l/0"} {
			p := filepath.Join(dir, m)
			if err := unix.Mount("tmpfs", p, "tmpfs", 0, ""); err != nil {
				t.Logf("no tmpfs mount (%v): only the plain removal is tested", err)
				break
			}
			t.Cleanup(func() { unix.Unmount(p, unix.MNT_DETACH) })
			os.WriteFile(filepath.Join(p, "keep"), nil, 0o644)
			mounted = true
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	removeTree(dir, st.Dev)
	for _, p := range []string{"init", "lib", "link"} {
		if _, err := os.Lstat(filepath.Join(dir, p)); !os.IsNotExist(err) {
			t.Errorf("%s is left: %v", p, err)
		}
	}
	if _, err := os.Stat("/etc"); err != nil {
		t.Errorf("the link's target went: %v", err)
	}
	if mounted {
		for _, p := range []string{"newroot/keep", "run/l/0/keep"} {
			if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
				t.Errorf("%s, below a mount point, is gone: %v", p, err)
			}
		}
	}
}

func TestCommandCaps(t *testing.T) {
	plain, calls := commandCaps(false), commandCaps(true)
	if calls != plain|1<<unix.CAP_SYS_ADMIN {
		t.Errorf("calls caps %#x, want %#x", calls, plain|1<<unix.CAP_SYS_ADMIN)
	}
	for _, c := range []int{unix.CAP_SYS_ADMIN, unix.CAP_SYS_MODULE, unix.CAP_SYS_PTRACE, unix.CAP_NET_RAW, unix.CAP_SYS_RESOURCE, unix.CAP_SYS_BOOT} {
		if plain&(1<<c) != 0 {
			t.Errorf("commands get capability %d", c)
		}
	}
	if n := len(agentrpc.SandboxCaps()); n != popcount(plain) {
		t.Errorf("%d capabilities in the mask, %d in agentrpc.SandboxCaps", popcount(plain), n)
	}
}

func popcount(m uint64) int {
	n := 0
	for ; m != 0; m &= m - 1 {
		n++
	}
	return n
}

// dropCapsChild runs in a child process of TestDropCaps: it drops the capabilities and runs cat
// /proc/self/status,
// as the agent would start a command, then writes its own status after a line "--self--".
func dropCapsChild() {
	if err := dropCaps(commandCaps(false)); err != nil {
		fmt.Fprintln(os.Stderr, "dropCaps:", err)
		os.Exit(1)
	}
	b, err := exec.Command("cat", "/proc/self/status").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cat:", err)
		os.Exit(1)
	}
	self, err := os.ReadFile("/proc/self/status")
	if err != nil {
		fmt.Fprintln(os.Stderr, "own status:", err)
		os.Exit(1)
	}
	os.Stdout.Write(b)
	os.Stdout.WriteString("--self--\n")
	os.Stdout.Write(self)
	os.Exit(0)
}

// TestDropCaps: after dropCaps, a command the process starts (as root) has the sandbox's
// capabilities and no_new_privs, and the process itself keeps CAP_SYS_BOOT in effect and forkCaps
// in its permitted set alone, all outside the bounding set: no command gets them.
func TestDropCaps(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	keep := commandCaps(false)
	// What this process (and the child) may hold at most.
	for c := 0; c <= agentrpc.LastCap(); c++ {
		if in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err != nil || in != 1 {
			keep &^= 1 << c
		}
	}
	if testing.Short() {
		t.Skip("builds a test binary")
	}
	bin := testBinary(t)
	for _, mode := range []string{"1"} {
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), "VMGUEST_TEST_DROPCAPS="+mode)
		out, err := cmd.Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				t.Fatalf("child: %v: %s", err, ee.Stderr)
			}
			t.Fatal(err)
		}
		command, self, _ := strings.Cut(string(out), "--self--\n")
		read := func(name, text string) map[string]uint64 {
			path := filepath.Join(t.TempDir(), name)
			os.WriteFile(path, []byte(text), 0o644)
			got, err := readStatus(path)
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		got := read("command", command)
		want := map[string]uint64{"CapBnd": keep, "CapEff": keep, "CapPrm": keep, "CapInh": 0, "CapAmb": 0, "NoNewPrivs": 1}
		for k, w := range want {
			if got[k] != w {
				t.Errorf("%s: command's %s = %#x, want %#x", mode, k, got[k], w)
			}
		}
		own := read("self", self)
		if own["CapEff"]&forkCaps != 0 || own["CapBnd"]&forkCaps != 0 || own["CapEff"]&(1<<unix.CAP_SYS_BOOT) == 0 ||
			own["CapPrm"]&forkCaps != forkCaps {
			t.Errorf("%s: the process's own CapEff %#x, CapPrm %#x, CapBnd %#x; want CAP_SYS_BOOT in effect, forkCaps %#x permitted only",
				mode, own["CapEff"], own["CapPrm"], own["CapBnd"], forkCaps)
		}
	}
}

// TestPinPort: the open function returns the port opened first, then opens it again through the
// pinned descriptor (here /dev/ptmx stands in for the port: a pollable character device).
func TestPinPort(t *testing.T) {
	if _, err := os.Stat("/dev/ptmx"); err != nil {
		t.Skip("no /dev/ptmx")
	}
	calls := 0
	find := func(string) (string, error) {
		calls++
		if calls < 3 {
			return "", os.ErrNotExist
		}
		return "/dev/ptmx", nil
	}
	open, err := pinPort(find, PortName, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		p, err := open()
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		f := p.(*os.File)
		if err := f.SetReadDeadline(time.Now()); err != nil {
			t.Errorf("open %d: no deadlines: %v", i, err)
		}
		f.Close()
	}
	if _, err := pinPort(func(string) (string, error) { return "", os.ErrNotExist }, PortName, 20*time.Millisecond); err == nil {
		t.Error("a missing port is found")
	}
}

// ioURingChild installs the agent's io_uring filter, then tries io_uring_setup in this process
// and in a child it starts (the filter is inherited), and prints what each got.
func ioURingChild() {
	if err := denyIOURing(); err != nil {
		fmt.Println("install:", err)
		os.Exit(1)
	}
	var params [120]byte
	_, _, errno := unix.Syscall(425, 8, uintptr(unsafe.Pointer(&params[0])), 0)
	fmt.Println("self:", errno)
	_, _, errno = unix.Syscall(unix.SYS_GETPID, 0, 0, 0)
	fmt.Println("getpid:", errno)
	if os.Getenv("VMGUEST_TEST_IOURING") == "1" {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "VMGUEST_TEST_IOURING=2")
		out, _ := cmd.CombinedOutput()
		fmt.Print("child ", string(out))
	}
}

// TestIOURingRefused: the microvm agent refuses io_uring to itself and every process it starts,
// with EPERM, and nothing else.
func TestIOURingRefused(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "VMGUEST_TEST_IOURING=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := "self: operation not permitted\ngetpid: errno 0\nchild self: operation not permitted\ngetpid: errno 0\n"
	if string(out) != want {
		t.Fatalf("got:\n%s\nwant:\n%s", out, want)
	}
}

// claimChild runs in a child process of TestClaimHostname, in a UTS namespace of its own: it
// drops the capabilities as a VM's init does, claims with hostname "claimed-box", claims
// again, and writes the hostname, the second claim's error and its own CapEff.
func claimChild() {
	if err := dropCaps(commandCaps(false)); err != nil {
		fmt.Fprintln(os.Stderr, "dropCaps:", err)
		os.Exit(1)
	}
	if err := ClaimHostname("claimed-box"); err != nil {
		fmt.Fprintln(os.Stderr, "claim:", err)
		os.Exit(1)
	}
	again := ClaimHostname("again")
	host, _ := os.Hostname()
	st, err := readStatus("/proc/self/status")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("%s\n%v\n%x\n", host, errors.Is(again, errdefs.ErrConflict), st["CapEff"])
	os.Exit(0)
}

// TestClaimHostname: a claimable VM's init sets the hostname once at the claim, on a thread of its
// own (CAP_SYS_ADMIN is in no other thread's effective set, before or after); a second claim is a
// conflict.
func TestClaimHostname(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if testing.Short() {
		t.Skip("builds a test binary")
	}
	bin := testBinary(t)
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), "VMGUEST_TEST_CLAIM=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUTS}
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("child: %v: %s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 3 || lines[0] != "claimed-box" || lines[1] != "true" {
		t.Fatalf("child: %q; want the claim's hostname and a conflict for the second", out)
	}
	eff, err := strconv.ParseUint(lines[2], 16, 64)
	if err != nil || eff&(1<<unix.CAP_SYS_ADMIN) != 0 || eff&(1<<unix.CAP_SYS_BOOT) == 0 {
		t.Errorf("CapEff after the claim = %s: want CAP_SYS_BOOT kept, CAP_SYS_ADMIN not in effect", lines[2])
	}
}

// TestClaimHostnameInvalid: a bad name is refused before anything changes, and does not use up
// the one claim.
func TestClaimHostnameInvalid(t *testing.T) {
	for _, name := range []string{"", "-x", "a b", strings.Repeat("a", 64)} {
		if err := ClaimHostname(name); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ClaimHostname(%q) = %v, want invalid", name, err)
		}
	}
	claim.Lock()
	done := claim.done
	claim.Unlock()
	if done {
		t.Errorf("a refused name used up the claim")
	}
}

// testBinary builds this package's tests as the agent is built, without cgo:
// syscall.AllThreadsSyscall needs such a binary, which a -race one is not.
func testBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "vmguest.test")
	build := exec.Command("go", "test", "-c", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go test -c: %v\n%s", err, b)
	}
	return bin
}
