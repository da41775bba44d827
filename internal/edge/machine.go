package edge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/websocket"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/runtime"
	"github.com/corral-dev/corral/internal/store"
	"github.com/corral-dev/corral/internal/vmdisk"
)

// vmDiskFile finds the disk image in a vm sandbox's mounted vm-image layer (lower, one
// directory): its one file, disk.qcow2 or disk.raw.
func vmDiskFile(lower []string) (path, format string, err error) {
	if len(lower) != 1 {
		return "", "", fmt.Errorf("a vm sandbox has one layer, its disk image, not %d", len(lower))
	}
	for _, c := range []struct{ name, format string }{{model.VMDiskQCOW2, vmdisk.QCOW2}, {model.VMDiskRaw, vmdisk.Raw}} {
		p := filepath.Join(lower[0], c.name)
		if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
			return p, c.format, nil
		}
	}
	return "", "", fmt.Errorf("the vm-image layer holds neither %s nor %s", model.VMDiskQCOW2, model.VMDiskRaw)
}

// CheckVMImage checks a vm-image layer before it is published: the layer (mounted from its
// digest) holds exactly one file, disk.qcow2 or disk.raw, that QEMU can boot without opening
// any other file (vmdisk.Inspect).
func (e *Edge) CheckVMImage(ctx context.Context, digest string) (vmdisk.Info, error) {
	dir, err := e.layers.Acquire(ctx, digest)
	if err != nil {
		return vmdisk.Info{}, err
	}
	defer e.layers.Release(digest)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return vmdisk.Info{}, err
	}
	if len(ents) != 1 {
		return vmdisk.Info{}, errdefs.Invalid("kind", "a vm-image layer holds exactly one file, %s or %s; this one has %d entries", model.VMDiskQCOW2, model.VMDiskRaw, len(ents))
	}
	format := ""
	switch ents[0].Name() {
	case model.VMDiskQCOW2:
		format = vmdisk.QCOW2
	case model.VMDiskRaw:
		format = vmdisk.Raw
	default:
		return vmdisk.Info{}, errdefs.Invalid("kind", "a vm-image layer holds %s or %s, not %q", model.VMDiskQCOW2, model.VMDiskRaw, ents[0].Name())
	}
	if !ents[0].Type().IsRegular() {
		return vmdisk.Info{}, errdefs.Invalid("kind", "%s in a vm-image layer is not a regular file", ents[0].Name())
	}
	return vmdisk.Inspect(filepath.Join(dir, ents[0].Name()), format)
}

// machineSandbox returns a running vm sandbox for a screen, input or console call, resuming a
// paused one (as any call does). It does not wait for the agent: the screen works before it.
func (e *Edge) machineSandbox(ctx context.Context, id string, off bool) (*sandbox, error) {
	sb, err := e.ownSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if !sb.machine || e.machines == nil {
		return nil, errdefs.Invalid("sandbox", "%s is not a vm sandbox: power and console are for the vm tier (screen, input and vnc work on a container with a desktop: corral env install desktop)", id)
	}
	if off {
		return sb, nil
	}
	if sb.paused.Load() {
		if _, err := e.resume(ctx, sb, false); err != nil && !errors.Is(err, errdefs.ErrConflict) {
			return nil, err
		}
	}
	if sb.off.Load() {
		return nil, errdefs.Conflict("sandbox %s is powered off: power it on first (corral power %s on)", id, id)
	}
	sb.touch()
	return sb, nil
}

// Screen returns a PNG screenshot of a sandbox's display and its size: a vm sandbox's machine
// display, or the X display inside any other sandbox (desktop.go).
func (e *Edge) Screen(ctx context.Context, id string) ([]byte, int, int, error) {
	sb, err := e.displaySandbox(ctx, id)
	if err != nil {
		return nil, 0, 0, err
	}
	if !sb.machine {
		return e.desktopScreen(ctx, sb)
	}
	return e.machines.Screen(ctx, sb.id)
}

// Input sends keyboard and mouse events to a sandbox's display (as Screen finds it).
func (e *Edge) Input(ctx context.Context, id string, events []model.InputEvent) (model.InputResult, error) {
	sb, err := e.displaySandbox(ctx, id)
	if err != nil {
		return model.InputResult{}, err
	}
	sb.actions.Add(1)
	evs := make([]runtime.InputEvent, len(events))
	for i, ev := range events {
		evs[i] = runtime.InputEvent(ev)
	}
	var res runtime.InputResult
	if sb.machine {
		res, err = e.machines.Input(ctx, sb.id, evs)
	} else {
		res, err = e.desktopInput(ctx, sb, evs)
	}
	return model.InputResult(res), err
}

// displaySandbox returns the running sandbox whose display a screen or input call drives: a vm
// sandbox as machineSandbox returns it (its display works before its agent), any other once its
// agent answers (its display is reached through the agent).
func (e *Edge) displaySandbox(ctx context.Context, id string) (*sandbox, error) {
	sb, err := e.ownSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb.machine {
		return e.machineSandbox(ctx, id, false)
	}
	return e.active(ctx, id)
}

// Console returns the end of a vm sandbox's serial console (at most limit bytes); it works in
// every state but stopped.
func (e *Edge) Console(ctx context.Context, id string, limit int64) ([]byte, error) {
	sb, err := e.machineSandbox(ctx, id, true)
	if err != nil {
		return nil, err
	}
	return e.machines.Console(sb.id, limit)
}

// Power turns a vm sandbox's machine off or on, or reboots it, and records its state (off while
// powered off; the TTL still runs).
func (e *Edge) Power(ctx context.Context, id string, req model.PowerRequest) (*store.Sandbox, error) {
	switch req.Action {
	case model.PowerOn, model.PowerOff, model.PowerReboot:
	default:
		return nil, errdefs.Invalid("action", "%q: want on, off or reboot", req.Action)
	}
	if req.Force && req.Action != model.PowerOff {
		return nil, errdefs.Invalid("force", "only power off can be forced")
	}
	sb, err := e.machineSandbox(ctx, id, true)
	if err != nil {
		return nil, err
	}
	ctx = context.WithoutCancel(ctx)
	sb.mu.Lock()
	gone, paused := sb.gone, sb.paused.Load()
	sb.mu.Unlock()
	switch {
	case gone:
		return nil, errdefs.Conflict("sandbox %s stopped", sb.id)
	case paused:
		return nil, errdefs.Conflict("sandbox %s is paused: resume it first", sb.id)
	}
	// Not under sb.mu: an ACPI power-off may take a minute, and the reaper takes sb.mu. The
	// runtime serialises the VM's own calls (a pause now waits, then finds it off).
	if err := e.machines.Power(ctx, sb.id, req.Action, req.Force); err != nil {
		return nil, err
	}
	off := req.Action == model.PowerOff
	sb.mu.Lock()
	defer sb.mu.Unlock()
	sb.off.Store(off) // the machine's state, whatever the store says (the reaper re-records it)
	sb.agentUp.Store(false)
	sb.touch()
	rec, err := e.record(ctx, sb.id)
	if err != nil {
		return nil, err
	}
	if sb.gone {
		return rec, nil // deleted meanwhile
	}
	rec.State = model.StateRunning
	if off {
		rec.State = model.StateOff
	}
	rec.LastActivityAt = time.Unix(0, sb.lastActivity.Load()).UTC()
	if err := e.records.PutSandbox(ctx, rec); err != nil {
		return nil, err
	}
	e.log.Info("vm power", "sandbox", sb.id, "action", req.Action, "force", req.Force)
	return rec, nil
}

// machinePower records what the reaper found a vm to be: off (its guest powered it off, or its
// QEMU ended) or on again (a power-on whose record failed).
func (e *Edge) machinePower(ctx context.Context, sb *sandbox, off bool) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.gone || sb.off.Load() == off || sb.paused.Load() {
		return
	}
	rec, err := e.record(ctx, sb.id)
	if err != nil {
		e.log.Error("record a vm's power state", "sandbox", sb.id, "err", err)
		return
	}
	rec.State = model.StateRunning
	if off {
		rec.State = model.StateOff
	}
	if err := e.records.PutSandbox(ctx, rec); err != nil {
		e.log.Error("record a vm's power state", "sandbox", sb.id, "err", err)
		return
	}
	sb.off.Store(off)
	sb.agentUp.Store(false)
	e.log.Info("vm power state recorded", "sandbox", sb.id, "state", rec.State)
}

// MaxConsole bounds what GET .../console returns (the end of the serial console).
const MaxConsole = 1 << 20

// screen serves GET /v1/sandboxes/{id}/screen: a PNG of the sandbox's display, its size in the
// X-Screen-Width and X-Screen-Height headers.
func (h *dataPlane) screen(w http.ResponseWriter, r *http.Request) {
	png, width, height, err := h.e.Screen(r.Context(), r.PathValue("id"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "image/png")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Screen-Width", strconv.Itoa(width))
	w.Header().Set("X-Screen-Height", strconv.Itoa(height))
	w.Header().Set("Content-Length", strconv.Itoa(len(png)))
	w.Write(png)
}

// input serves POST /v1/sandboxes/{id}/input (corral.InputRequest).
func (h *dataPlane) input(w http.ResponseWriter, r *http.Request) {
	var req model.InputRequest
	if err := httpjson.Decode(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	res, err := h.e.Input(r.Context(), r.PathValue("id"), req.Events)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, res)
}

// console serves GET /v1/sandboxes/{id}/console?bytes=N: the end of the serial console output
// (default and most MaxConsole bytes), as text.
func (h *dataPlane) console(w http.ResponseWriter, r *http.Request) {
	limit := int64(MaxConsole)
	if v := r.URL.Query().Get("bytes"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 || n > MaxConsole {
			h.fail(w, r, errdefs.Invalid("bytes", "%q: want 1 to %d", v, MaxConsole))
			return
		}
		limit = n
	}
	b, err := h.e.Console(r.Context(), r.PathValue("id"), limit)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Write(b)
}

// VNCUpgrade is the Upgrade header value of GET /v1/sandboxes/{id}/vnc: the connection becomes
// the RFB stream of the vm's display (corral vnc serves it to local VNC viewers).
const VNCUpgrade = "corral-vnc"

// VNCWebSocketProtocol is the WebSocket subprotocol GET /v1/sandboxes/{id}/vnc answers with when
// a browser offers it (noVNC does): binary frames carrying RFB.
const VNCWebSocketProtocol = "binary"

// vnc connects a new RFB client to a sandbox's display: a vm's machine display (QEMU's VNC
// server), or the X display inside any other sandbox (x11vnc, started on first use: desktop.go).
// It returns the sandbox too, whose activity the caller keeps up while the client is connected.
func (e *Edge) vnc(ctx context.Context, id string) (net.Conn, *sandbox, error) {
	sb, err := e.ownSandbox(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if sb.machine {
		if sb, err = e.machineSandbox(ctx, id, false); err != nil {
			return nil, nil, err
		}
		conn, err := e.machines.VNC(ctx, sb.id)
		return conn, sb, err
	}
	if sb, err = e.active(ctx, id); err != nil {
		return nil, nil, err
	}
	conn, err := e.desktopVNC(ctx, sb)
	return conn, sb, err
}

// vnc serves GET /v1/sandboxes/{id}/vnc: the connection is upgraded and carries RFB (VNC) to and
// from the sandbox's display for as long as both ends keep it open, either as the raw stream
// ("Upgrade: corral-vnc", corral vnc) or in WebSocket binary frames ("Upgrade: websocket", the
// web console's noVNC; a browser's WebSocket cannot send an Authorization header, so it offers
// the token as a subprotocol, which the API's authentication takes and removes).
func (h *dataPlane) vnc(w http.ResponseWriter, r *http.Request) {
	upgrade := r.Header.Get("Upgrade")
	ws := strings.EqualFold(upgrade, "websocket")
	if !ws && !strings.EqualFold(upgrade, VNCUpgrade) {
		h.fail(w, r, errdefs.Invalid("Upgrade", "GET .../vnc upgrades the connection to RFB: send Connection: Upgrade and Upgrade: %s (corral vnc ID serves it to local VNC viewers) or Upgrade: websocket (noVNC)", VNCUpgrade))
		return
	}
	var offered []string
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				offered = append(offered, p)
			}
		}
	}
	if ws && len(offered) > 0 && !slices.Contains(offered, VNCWebSocketProtocol) {
		h.fail(w, r, errdefs.Invalid("Sec-WebSocket-Protocol", "%q: the VNC WebSocket speaks %q only", strings.Join(offered, ", "), VNCWebSocketProtocol))
		return
	}
	conn, sb, err := h.e.vnc(r.Context(), r.PathValue("id"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer conn.Close()
	h.log.Info("vnc client connected", "sandbox", sb.id, "websocket", ws)
	// A person working through VNC is activity: the idle TTL and auto-pause must not end the
	// session under them.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				sb.touch()
			}
		}
	}()
	if ws {
		srv := websocket.Server{
			Handshake: func(cfg *websocket.Config, _ *http.Request) error {
				cfg.Protocol = nil
				if len(offered) > 0 {
					cfg.Protocol = []string{VNCWebSocketProtocol}
				}
				return nil
			},
			Handler: func(c *websocket.Conn) {
				c.PayloadType = websocket.BinaryFrame
				pipe(c, c, conn)
			},
		}
		srv.ServeHTTP(w, r)
	} else {
		hj, ok := w.(http.Hijacker)
		if !ok {
			h.fail(w, r, errdefs.Unavailable("this connection cannot be upgraded"))
			return
		}
		client, buf, err := hj.Hijack()
		if err != nil {
			h.log.Warn("vnc: hijack", "sandbox", sb.id, "err", err)
			return
		}
		fmt.Fprintf(buf, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", VNCUpgrade)
		if err := buf.Flush(); err != nil {
			client.Close()
			return
		}
		pipe(client, buf, conn) // what the client sent, buffered bytes first
	}
	sb.touch()
	h.log.Info("vnc client disconnected", "sandbox", sb.id)
}

// pipe copies between a client (read through in, which may hold bytes read ahead) and the
// display's RFB server until either end closes, then closes both.
func pipe(client io.WriteCloser, in io.Reader, display net.Conn) {
	done := make(chan struct{}, 2)
	go func() {
		io.Copy(display, in)
		display.Close()
		done <- struct{}{}
	}()
	go func() {
		io.Copy(client, display)
		client.Close()
		done <- struct{}{}
	}()
	<-done
	<-done
}
