package edge

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/computeruse"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime"
)

// Computer use on container and microvm sandboxes: the screen and input routes, which on the vm
// tier reach QEMU's display, reach an X display inside any other sandbox (the desktop recipe's
// Xvfb on :0) by running scrot and xdotool there through the agent (computeruse's scripts). So
// an agent has one computer-use API whatever the tier; a sandbox without the tools or without a
// display answering is a conflict that says which.

// Bounds of one desktop script: a screenshot of a large display is a few MB, typing 1024 keys
// takes about 10 s.
const (
	desktopOutputLimit = 64 << 20
	desktopTimeout     = 60 * time.Second
)

// desktopRun runs script (computeruse's) in sandbox sb and returns its stdout, or a conflict
// when the sandbox has no display to drive.
func (e *Edge) desktopRun(ctx context.Context, sb *sandbox, what, script string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, desktopTimeout+5*time.Second)
	defer cancel()
	sess, err := sb.agent.Exec(ctx, agentrpc.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, Cwd: "/", User: sb.user,
		Timeout: desktopTimeout, OutputLimit: desktopOutputLimit})
	if err != nil {
		return nil, fmt.Errorf("%s of %s: %w", what, sb.id, err)
	}
	defer sess.Close()
	if err := startError(sess.Info()); err != nil {
		return nil, fmt.Errorf("%s of %s: %w", what, sb.id, err)
	}
	var stdout, stderr capped
	stdout.limit, stderr.limit = desktopOutputLimit, 4<<10
	for {
		ev, err := sess.Next()
		if err != nil {
			return nil, fmt.Errorf("%s of %s: %w", what, sb.id, err)
		}
		switch ev.Type {
		case agentrpc.EventStdout:
			stdout.Write(ev.Data)
		case agentrpc.EventStderr:
			stderr.Write(ev.Data)
		case agentrpc.EventExit:
			x := exitOf(ev.Exit)
			msg := strings.TrimSpace(stderr.b.String())
			switch {
			case x.Code == 0:
				if stdout.truncated {
					return nil, fmt.Errorf("%s of %s: more than %d bytes of output: %w", what, sb.id, desktopOutputLimit, errdefs.ErrTooLarge)
				}
				return stdout.b.Bytes(), nil
			case x.Code == computeruse.ExitNoTools || x.Code == 127 && x.Error != "":
				return nil, errdefs.Conflict("sandbox %s has no desktop: scrot and xdotool are not installed in it (screen and input drive an X display; create the sandbox from the desktop environment: corral env install desktop)", sb.id)
			case x.Code == computeruse.ExitNoVNC:
				return nil, errdefs.Conflict("sandbox %s has no VNC server: x11vnc is not installed in it (the desktop environment has it: corral env install desktop)", sb.id)
			case x.Code == computeruse.ExitNoDisplay:
				display, detail, _ := strings.Cut(msg, "\n")
				e.log.Info("no X display in a sandbox", "sandbox", sb.id, "display", display, "detail", detail)
				return nil, errdefs.Conflict("sandbox %s has no display: no X server answers on %s in it (the desktop environment starts one on :0 with the sandbox; a sandbox of another environment starts its own, e.g. Xvfb :0)", sb.id, display)
			case x.TimedOut:
				return nil, fmt.Errorf("%s of %s: took more than %s: %w", what, sb.id, desktopTimeout, errdefs.ErrUnavailable)
			default:
				return nil, fmt.Errorf("%s of %s: exit %d: %s: %w", what, sb.id, x.Code, msg, errdefs.ErrUnavailable)
			}
		}
	}
}

// desktopScreen returns a PNG of the X display in sandbox sb and its size.
func (e *Edge) desktopScreen(ctx context.Context, sb *sandbox) ([]byte, int, int, error) {
	png, err := e.desktopRun(ctx, sb, "screen", computeruse.ScreenScript)
	if err != nil {
		return nil, 0, 0, err
	}
	w, h, err := computeruse.PNGSize(png)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("screen of %s: scrot wrote %d bytes: %w", sb.id, len(png), err)
	}
	return png, w, h, nil
}

// desktopInput sends events to the X display in sandbox sb; mouse coordinates are the display's
// pixels.
func (e *Edge) desktopInput(ctx context.Context, sb *sandbox, events []runtime.InputEvent) (runtime.InputResult, error) {
	script, err := computeruse.InputScript(events)
	if err != nil {
		return runtime.InputResult{}, err
	}
	out, err := e.desktopRun(ctx, sb, "input", script)
	if err != nil {
		return runtime.InputResult{}, err
	}
	w, h, err := computeruse.ParseGeometry(bytes.TrimSpace(out))
	if err != nil {
		return runtime.InputResult{}, fmt.Errorf("input to %s: %w", sb.id, err)
	}
	return runtime.InputResult{Events: len(events), Width: w, Height: h}, nil
}

// desktopVNC connects to the RFB server of the X display in sandbox sb (x11vnc on
// computeruse.VNCPort of its loopback), starting one when nothing answers there.
func (e *Edge) desktopVNC(ctx context.Context, sb *sandbox) (net.Conn, error) {
	rec, err := e.record(ctx, sb.id)
	if err != nil {
		return nil, err
	}
	dial, err := e.dialerFor(ctx, sb, rec)
	if err != nil {
		return nil, err
	}
	if conn, err := dial(ctx, computeruse.VNCPort); err == nil {
		return conn, nil
	}
	if _, err := e.desktopRun(ctx, sb, "vnc", computeruse.VNCScript); err != nil {
		return nil, err
	}
	// x11vnc -bg returns once it listens; a second viewer racing this one may have started the
	// x11vnc that answers, still setting up: a few tries, 5 s at most.
	deadline := time.Now().Add(5 * time.Second)
	for {
		conn, err := dial(ctx, computeruse.VNCPort)
		if err == nil || time.Now().After(deadline) {
			if err != nil {
				return nil, fmt.Errorf("vnc of %s: x11vnc started but does not answer on port %d: %w", sb.id, computeruse.VNCPort, err)
			}
			return conn, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
