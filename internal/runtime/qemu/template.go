package qemu

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/runtime"
	"github.com/corral-dev/corral/internal/vmguest"
)

// Templates (Config.Templates): a VM booted as far as its kernel and the guest's init go
// without knowing its sandbox, and snapshotted there, waiting for its configuration on the port
// (vmguest.Config.Template). A new sandbox whose VM has the same shape (QEMU's command line
// with its name and files taken out, which leaves memory, vCPUs, the number and kind of disks,
// a network card or not, the kernel and initramfs) starts from that snapshot instead of booting,
// and gets its configuration over the port. The template has never read a disk or probed a
// network card (their drivers load after the configuration), so its snapshot holds nothing of
// any layer, sandbox or network: one template serves every environment of its shape.
//
// The first create of a shape boots and builds the shape's template in the background; later
// creates of it restore. Templates live in <StateDir>/.templates/<key>/ and are removed when a
// Runtime starts and when it closes (a new QEMU, kernel or agent makes them stale; they are
// rebuilt on demand).

const templatesDir = ".templates"

// templateKey names the template of a VM with files and spec: a digest of the template's
// command line (which names the kernel and the content-named initramfs) and QEMU's version.
func (r *Runtime) templateKey(spec *runtime.Spec, files []vmFile) string {
	tfiles, _ := r.templateFiles(files, "")
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00", r.version, r.cfg.QEMU)
	for _, a := range r.args(spec, tfiles, true) {
		fmt.Fprintf(h, "%s\x00", a)
	}
	for _, f := range tfiles {
		if f.Role == "kernel" || f.Role == "initrd" {
			fmt.Fprintf(h, "%s=%s\x00", f.Role, f.Path)
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:24]
}

// templateFiles maps a sandbox's files to its template's, in dir: the same roles in the same
// order, with a blank disk of its own for every disk and a tap that leads nowhere.
func (r *Runtime) templateFiles(files []vmFile, dir string) ([]vmFile, []string) {
	var blanks []string
	out := make([]vmFile, len(files))
	for i, f := range files {
		t := vmFile{Role: f.Role, Serial: f.Serial}
		switch f.Role {
		case "layer", "upper", "upper-ro":
			t.Path = filepath.Join(dir, "blank-"+f.Serial+".img")
			if f.Role != "upper-ro" {
				blanks = append(blanks, t.Path)
			}
		case "tap":
			t.Role = "private-tap"
		case "kernel", "initrd":
			t.Path = f.Path
		case "config":
			t.Path = filepath.Join(dir, "guest.json")
		case "console":
			t.Path = filepath.Join(dir, "console.log")
		case "qmp":
			t.Path = filepath.Join(dir, "qmp.sock")
		case "ctl":
			t.Path = filepath.Join(dir, "ctl.sock")
		}
		out[i] = t
	}
	return out, blanks
}

// templateSnapshot returns the snapshot of the template key, or "" when there is none yet.
func (r *Runtime) templateSnapshot(key string) string {
	p := filepath.Join(r.cfg.StateDir, templatesDir, key, snapshotFile)
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// kickTemplate builds the template key in the background unless it exists or is being built.
func (r *Runtime) kickTemplate(key string, spec runtime.Spec, files []vmFile) {
	r.mu.Lock()
	if r.building[key] || r.closed || r.templateSnapshot(key) != "" || time.Now().Before(r.failedUntil[key]) {
		r.mu.Unlock()
		return
	}
	r.building[key] = true
	r.builds.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.builds.Done()
		defer func() {
			r.mu.Lock()
			delete(r.building, key)
			r.mu.Unlock()
		}()
		start := time.Now()
		ctx, cancel := context.WithTimeout(r.ctx, r.cfg.BootTimeout+time.Minute)
		defer cancel()
		if err := r.buildTemplate(ctx, key, &spec, files); err != nil {
			r.log.Error("build a microvm template; VMs of its shape boot until it exists (next try in 10m)", "template", key, "err", err)
			r.templateFailed(key)
			return
		}
		r.log.Info("microvm template ready", "template", key, "memory_mib", spec.MemoryBytes>>20, "took", time.Since(start).Round(time.Millisecond))
	}()
}

// buildTemplate boots the template key, waits until its guest asks for its configuration and
// saves it. It is built in <key>.tmp and renamed into place once complete.
func (r *Runtime) buildTemplate(ctx context.Context, key string, spec *runtime.Spec, files []vmFile) (err error) {
	root := filepath.Join(r.cfg.StateDir, templatesDir)
	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	dir := filepath.Join(root, key+".tmp")
	os.RemoveAll(dir)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	tfiles, blanks := r.templateFiles(files, dir)
	for _, b := range blanks {
		if err := os.WriteFile(b, make([]byte, 1<<20), 0o600); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "guest.json"), []byte(`{"template":true}`), 0o644); err != nil {
		return err
	}
	// Read by the template VM's own uid through a descriptor, whatever the umask took off.
	if err := os.Chmod(filepath.Join(dir, "guest.json"), 0o644); err != nil {
		return err
	}
	id := "template-" + key
	uid, err := r.allocUID(id)
	if err != nil {
		return err
	}
	defer r.freeUID(id)
	st := &vmState{ID: id, UID: uid, Files: tfiles, Args: r.args(spec, tfiles, true),
		FileLimit: spec.MemoryBytes + 64<<20, dir: dir}
	if err := r.start(ctx, st, false); err != nil {
		return err
	}
	defer kill(context.WithoutCancel(ctx), st)
	// The guest writes ConfigReady once it waits for its configuration: save it then.
	conn, err := dialUnix(ctx, filepath.Join(dir, "ctl.sock"))
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := awaitLine(ctx, conn, func(l string) bool { return l == vmguest.ConfigReady }); err != nil {
		return fmt.Errorf("the template did not ask for its config: %w%s%s", err, fileTail(filepath.Join(dir, "qemu.log"), "qemu"), fileTail(filepath.Join(dir, "console.log"), "console"))
	}
	q, err := dialQMP(ctx, filepath.Join(dir, "qmp.sock"))
	if err != nil {
		return err
	}
	defer q.Close()
	if err := q.run(ctx, "stop", nil, nil); err != nil {
		return err
	}
	if err := save(ctx, q, filepath.Join(dir, snapshotFile)); err != nil {
		return err
	}
	q.run(ctx, "quit", nil, nil)
	final := filepath.Join(root, key)
	os.RemoveAll(final)
	return os.Rename(dir, final)
}

// restoreTemplate starts st's VM from the snapshot of a template and hands the guest its
// configuration c over the port.
func (r *Runtime) restoreTemplate(ctx context.Context, st *vmState, snapshot string, c *vmguest.Config) error {
	f, err := os.Open(snapshot)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := r.start(ctx, st, true); err != nil {
		return err
	}
	dir := r.dir(st.ID)
	if err := incoming(ctx, filepath.Join(dir, "qmp.sock"), f); err != nil {
		return fmt.Errorf("restore the template: %w%s", err, r.qemuLogTail(st.ID))
	}
	if err := sendConfig(ctx, filepath.Join(dir, "ctl.sock"), c); err != nil {
		return fmt.Errorf("%w%s%s", err, r.qemuLogTail(st.ID), r.consoleTail(st.ID))
	}
	return nil
}

// sendConfig gives a VM restored from a template its configuration: with a fresh seed for its
// entropy pool and the host's clock, which the clones of a template would otherwise share.
func sendConfig(ctx context.Context, ctl string, c *vmguest.Config) error {
	cc := *c
	cc.Seed = make([]byte, 64)
	rand.Read(cc.Seed)
	cc.Now = time.Now().UnixNano()
	b, err := json.Marshal(&cc)
	if err != nil {
		return err
	}
	nonce := make([]byte, 8)
	rand.Read(nonce)
	n := hex.EncodeToString(nonce)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := dialUnix(ctx, ctl)
	if err != nil {
		return err
	}
	defer conn.Close()
	line := fmt.Sprintf("%s%s %s\n", vmguest.ConfigPrefix, n, base64.StdEncoding.EncodeToString(b))
	send := func() error {
		if _, err := io.WriteString(conn, line); err != nil {
			return fmt.Errorf("send the config: %w", err)
		}
		return nil
	}
	if err := send(); err != nil {
		return err
	}
	// The guest may drop the line while it reopens its port after the restore; it then says
	// it is ready again: send the line again each time.
	var serr error
	err = awaitLine(ctx, conn, func(l string) bool {
		if l == vmguest.ConfigReady && serr == nil {
			serr = send()
		}
		return l == vmguest.ConfigOKPrefix+n || serr != nil
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("the restored VM did not take its config: %w", err)
	}
	return nil
}

func dialUnix(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", path)
}

// awaitLine reads lines from conn until match accepts one, ctx ends or 1 MiB went by.
func awaitLine(ctx context.Context, conn net.Conn, match func(string) bool) error {
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	r := bufio.NewReader(conn)
	read := 0
	for read < 1<<20 {
		line, err := r.ReadString('\n')
		read += len(line)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if match(strings.TrimRight(line, "\n")) {
			return nil
		}
	}
	return errors.New("no answer in the first MiB")
}

// removeTemplates deletes every template (at start: they may be stale).
func (r *Runtime) removeTemplates() {
	os.RemoveAll(filepath.Join(r.cfg.StateDir, templatesDir))
}

// templateFailed removes the template key and keeps it from being built again for a while: a
// template that cannot be built or restored must not cost every create of its shape a try.
func (r *Runtime) templateFailed(key string) {
	os.RemoveAll(filepath.Join(r.cfg.StateDir, templatesDir, key))
	r.mu.Lock()
	r.failedUntil[key] = time.Now().Add(10 * time.Minute)
	r.mu.Unlock()
}
