package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/doccheck"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guestimage"
	"github.com/corral-dev/corral/internal/runtime"
)

func TestDocComments(t *testing.T) { doccheck.Exported(t, ".") }

func testRuntime(t *testing.T) *Runtime {
	t.Helper()
	return &Runtime{cfg: Config{StateDir: t.TempDir(), UIDBase: 1000, UIDCount: 2, QEMU: "/usr/bin/qemu-system-x86_64"},
		accel: AccelTCG, version: "QEMU 7.2", uids: map[uint32]string{}, locks: map[string]*sync.Mutex{}}
}

// resolved gives s's zero limits what admission resolves (internal/limits; the runtime
// defaults none).
func resolved(s runtime.Spec) runtime.Spec {
	if s.CPUs == 0 {
		s.CPUs = 1
	}
	if s.MemoryBytes == 0 {
		s.MemoryBytes = 512 << 20
	}
	if s.DiskBytes == 0 {
		s.DiskBytes = 1 << 30
	}
	if s.Pids == 0 {
		s.Pids = 1024
	}
	if s.OpenFiles == 0 {
		s.OpenFiles = 4096
	}
	return s
}

func TestValidate(t *testing.T) {
	r := testRuntime(t)
	ok := resolved(runtime.Spec{ID: "sb-1", Images: []runtime.LayerImage{{Image: "/l0"}}})
	want := ok
	if err := r.validate(&ok); err != nil || ok.MemoryBytes != want.MemoryBytes || ok.DiskBytes != want.DiskBytes {
		t.Fatalf("validate(%+v): %v; want it valid and its limits kept", ok, err)
	}
	seven := make([]runtime.LayerImage, 7)
	for i := range seven {
		seven[i] = runtime.LayerImage{Image: "/i", Devices: []string{"/b"}}
	}
	for name, c := range map[string]struct {
		spec  runtime.Spec
		field string // "": an internal error (a limit not resolved)
	}{
		"no layers":       {runtime.Spec{ID: "a"}, "Images"},
		"bad id":          {runtime.Spec{ID: "../x", Images: ok.Images}, "ID"},
		"calls":           {runtime.Spec{ID: "a", Images: ok.Images, Calls: true}, "Calls"},
		"too many disks":  {runtime.Spec{ID: "a", Images: seven}, "layers"},
		"netns, no addrs": {resolved(runtime.Spec{ID: "a", Images: ok.Images, Netns: "/run/netns/x"}), "Addr"},
		"no limits":       {runtime.Spec{ID: "a", Images: ok.Images}, ""},
		"small memory":    {resolved(runtime.Spec{ID: "a", Images: ok.Images, MemoryBytes: 64 << 20}), ""},
		"small disk":      {resolved(runtime.Spec{ID: "a", Images: ok.Images, DiskBytes: 1 << 20}), ""},
	} {
		err := r.validate(&c.spec)
		if c.field == "" {
			if err == nil || errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("%s: %v; want an internal error (admission resolves limits)", name, err)
			}
			continue
		}
		if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Field(err) != c.field {
			t.Errorf("%s: %v; want invalid %s", name, err, c.field)
		}
	}
}

func TestGuestAgentArgs(t *testing.T) {
	got := guestAgentArgs([]string{"serve", "--fd", "3", "--retain-exited", "64", "--listen=/x", "--retain-for", "1m"})
	if want := []string{"serve", "--retain-exited", "64", "--retain-for", "1m"}; !slices.Equal(got, want) {
		t.Fatalf("guestAgentArgs = %q, want %q", got, want)
	}
}

func testFiles(r *Runtime, spec *runtime.Spec, dir string) []vmFile {
	c, files, err := r.guestConfig(spec, filepath.Join(dir, "upper.img"))
	if err != nil {
		panic(err)
	}
	_ = c
	return append(files, vmFile{Role: "kernel", Path: "/k"}, vmFile{Role: "initrd", Path: "/i"},
		vmFile{Role: "config", Path: filepath.Join(dir, "guest.json")}, vmFile{Role: "console", Path: filepath.Join(dir, "console.log")},
		vmFile{Role: "qmp", Path: filepath.Join(dir, "qmp.sock")}, vmFile{Role: "ctl", Path: filepath.Join(dir, "ctl.sock")})
}

// TestArgs: QEMU's command line names no host path (every file is a descriptor), has the
// seccomp sandbox, read-only layers, the serials the guest looks for; a template's differs only
// in its name.
func TestArgs(t *testing.T) {
	r := testRuntime(t)
	spec := runtime.Spec{ID: "sb-1", Hostname: "h", MemoryBytes: 256 << 20, CPUs: 1.5, DiskBytes: 1 << 30,
		Images: []runtime.LayerImage{{Image: "/img/base.erofs", Devices: []string{"/mnt/base.blob"}}, {Image: "/img/tk.erofs"}},
		Netns:  "/run/netns/x", Addr: netip.MustParseAddr("10.0.0.2"), Gateway: netip.MustParseAddr("10.0.0.1")}
	dir := filepath.Join(r.cfg.StateDir, spec.ID)
	files := testFiles(r, &spec, dir)
	args := r.args(&spec, files, false)
	line := strings.Join(args, " ")
	for _, want := range []string{"-m 256", "-smp 2", "-accel tcg,thread=multi", "tsc_early_khz=", "tsc=reliable",
		"-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"serial=l0 ", "serial=l0d0 ", "serial=l1 ", "serial=upper ", "readonly=on", "-netdev tap,id=net0,fd=",
		"-kernel /proc/self/fd/", "chardev=qmp,mode=control", "name=corral.ctl", "-name corral-sb-1"} {
		if !strings.Contains(line+" ", want) {
			t.Errorf("args lack %q:\n%s", want, line)
		}
	}
	for _, a := range args {
		if strings.Contains(a, dir) || strings.Contains(a, "/img/") || strings.Contains(a, "/mnt/") {
			t.Errorf("args name a host path: %q", a)
		}
	}
	tpl, _ := r.templateFiles(files, t.TempDir())
	targs := r.args(&spec, tpl, true)
	if len(targs) != len(args) {
		t.Fatalf("template args: %d, sandbox args: %d", len(targs), len(args))
	}
	for i := range args {
		if args[i] != targs[i] && !(args[i] == "corral-sb-1" && targs[i] == "corral-template") {
			t.Errorf("arg %d: sandbox %q, template %q", i, args[i], targs[i])
		}
	}
}

// TestTemplateKey: VMs of one shape share a template whatever their layers, names or
// addresses; memory, vCPUs, the disks and the network card make another shape.
func TestTemplateKey(t *testing.T) {
	r := testRuntime(t)
	base := runtime.Spec{ID: "sb-1", MemoryBytes: 256 << 20, CPUs: 1, DiskBytes: 1 << 30, Images: []runtime.LayerImage{{Image: "/a", Devices: []string{"/b"}}}}
	key := func(s runtime.Spec) string {
		return r.templateKey(&s, testFiles(r, &s, filepath.Join(r.cfg.StateDir, s.ID)))
	}
	k := key(base)
	same := base
	same.ID, same.Hostname, same.Env = "sb-2", "other", []string{"A=1"}
	same.Images = []runtime.LayerImage{{Image: "/c", Devices: []string{"/d"}}}
	if key(same) != k {
		t.Errorf("another sandbox of the same shape has another template")
	}
	for name, change := range map[string]func(*runtime.Spec){
		"memory": func(s *runtime.Spec) { s.MemoryBytes = 512 << 20 },
		"cpus":   func(s *runtime.Spec) { s.CPUs = 2 },
		"layers": func(s *runtime.Spec) { s.Images = append(s.Images, runtime.LayerImage{Image: "/e"}) },
		"net": func(s *runtime.Spec) {
			s.Netns, s.Addr, s.Gateway = "/run/netns/x", netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.1")
		},
	} {
		s := base
		change(&s)
		if key(s) == k {
			t.Errorf("%s: same template key as the base shape", name)
		}
	}
}

func TestUIDs(t *testing.T) {
	r := testRuntime(t)
	a, err1 := r.allocUID("a")
	b, err2 := r.allocUID("b")
	if err1 != nil || err2 != nil || a == b {
		t.Fatalf("uids %d %d, %v %v", a, b, err1, err2)
	}
	if _, err := r.allocUID("c"); !errors.Is(err, errdefs.ErrExhausted) {
		t.Fatalf("a third uid of two: %v", err)
	}
	r.freeUID("a")
	if c, err := r.allocUID("c"); err != nil || c != a {
		t.Fatalf("after a free: %d, %v; want %d", c, err, a)
	}
}

// fakeQMP answers QMP like QEMU: a greeting, then one reply per command; getfd must come with
// a descriptor.
func fakeQMP(t *testing.T, path string, replies map[string]string) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte(`{"QMP": {"version": {}, "capabilities": []}}` + "\n"))
		buf := make([]byte, 4096)
		oob := make([]byte, 128)
		for {
			n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			var req struct {
				Execute string `json:"execute"`
			}
			json.Unmarshal(buf[:n], &req)
			if req.Execute == "getfd" {
				msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
				if len(msgs) != 1 {
					c.Write([]byte(`{"error": {"class": "GenericError", "desc": "No file descriptor supplied via SCM_RIGHTS"}}` + "\n"))
					continue
				}
				fds, _ := unix.ParseUnixRights(&msgs[0])
				for _, fd := range fds {
					unix.Close(fd)
				}
			}
			// An event first: the client must skip it.
			c.Write([]byte(`{"event": "STOP", "timestamp": {}}` + "\n"))
			r, ok := replies[req.Execute]
			if !ok {
				r = `{"return": {}}`
			}
			c.Write([]byte(r + "\n"))
		}
	}()
}

func TestQMP(t *testing.T) {
	path := filepath.Join(t.TempDir(), "qmp.sock")
	fakeQMP(t, path, map[string]string{
		"query-kvm":     `{"return": {"enabled": false, "present": true}}`,
		"query-status":  `{"return": {"status": "paused", "running": false}}`,
		"query-migrate": `{"return": {"status": "completed", "ram": {"total": 10, "transferred": 10}}}`,
		"migrate":       `{"error": {"class": "GenericError", "desc": "nope"}}`,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	q, err := dialQMP(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if a, err := q.accelerator(ctx); err != nil || a != AccelTCG {
		t.Fatalf("accelerator = %q, %v", a, err)
	}
	if s, err := q.status(ctx); err != nil || s != "paused" {
		t.Fatalf("status = %q, %v", s, err)
	}
	if _, err := q.waitMigration(ctx); err != nil {
		t.Fatal(err)
	}
	var qe *qmpError
	if err := q.run(ctx, "migrate", nil, nil); !errors.As(err, &qe) || qe.Desc != "nope" {
		t.Fatalf("a QMP error: %v", err)
	}
	f, _ := os.Open(os.DevNull)
	defer f.Close()
	if err := q.sendFile(ctx, "snap", f); err != nil {
		t.Fatalf("getfd: %v", err)
	}
}

// TestBootImageNeedsStaticAgent: the initramfs is built from the agent binary; a dynamic one
// is refused with a clear error.
func TestBootImageNeedsStaticAgent(t *testing.T) {
	k, err := guestimage.LoadKernel(guestimage.DefaultKernelDir)
	if err != nil {
		t.Skipf("needs the guest kernel (scripts/guest-kernel.sh): %v", err)
	}
	r := testRuntime(t)
	r.kernel, r.images, r.cfg.CacheDir = k, map[string]imageEntry{}, t.TempDir()
	if _, err := r.bootImage(context.Background(), "/bin/true"); err == nil || !strings.Contains(err.Error(), "static") {
		t.Fatalf("a dynamic agent: %v", err)
	}
}
