package e2e

import (
	"context"
	"encoding/binary"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	corral "github.com/corral-dev/corral/sdk/go"
)

// installDesktop publishes the desktop environment in p with the CLI (`corral env install
// desktop`): the first run on a host builds its packages layer from Debian's packages (about
// 1.5 minutes here, a 1 GB layer with Chromium), later ones find it in
// /var/cache/corral/recipes/, so every desktop test shares one build.
func installDesktop(t *testing.T, p *corralProc) {
	t.Helper()
	out, stderr, code := p.cli("", "env", "install", "desktop")
	if code != 0 {
		t.Fatalf("corral env install desktop: exit %d\n%s", code, stderr)
	}
	if strings.TrimSpace(out) != "desktop" || !strings.Contains(stderr, "environment desktop: base:") {
		t.Fatalf("corral env install desktop: stdout %q, stderr:\n%s", out, stderr)
	}
}

// pngSize reads a PNG's size from its header, failing the test when b is no PNG.
func pngSize(t *testing.T, b []byte) (int, int) {
	t.Helper()
	if len(b) < 24 || string(b[:8]) != "\x89PNG\r\n\x1a\n" {
		t.Fatalf("not a PNG: %d bytes %.16q", len(b), b)
	}
	return int(binary.BigEndian.Uint32(b[16:])), int(binary.BigEndian.Uint32(b[20:]))
}

// cursorAt returns the X pointer's position in sandbox id (xdotool getmouselocation).
func cursorAt(t *testing.T, p *corralProc, id string) string {
	t.Helper()
	out := p.sh(id, "DISPLAY=:0 xdotool getmouselocation")
	f := strings.Fields(out)
	if len(f) < 2 {
		t.Fatalf("xdotool getmouselocation: %q", out)
	}
	return f[0] + " " + f[1]
}

// waitXFCE waits until XFCE runs in sandbox id: its start puts the pointer in the middle of the
// screen, so pointer checks come after it.
func waitXFCE(t *testing.T, p *corralProc, id string) {
	t.Helper()
	eventually(t, time.Minute, "XFCE", func() bool {
		_, _, x := p.run(id, "sh", "-c", "pgrep -x xfce4-session && pgrep -x xfwm4 && pgrep -x xfdesktop && pgrep -x xfce4-panel")
		return x.Code == 0
	})
}

// TestDesktop: `corral env install desktop` publishes an environment whose container sandboxes
// start an X desktop (Xvfb, XFCE) with the sandbox; Corral's screen and input routes, its CLI
// (screen, type, key, click) and E2B's unmodified @e2b/desktop SDK see and drive it; the SDK's
// noVNC stream opens in headless Chromium and shows the desktop; a sandbox without a desktop is
// a conflict naming why, and bad input changes nothing.
func TestDesktop(t *testing.T) {
	needRoot(t)
	e2bAddr := freePort(t)
	p := withBase(t, "--e2b-listen", e2bAddr, "--e2b-domain", "e2b.test")
	installDesktop(t, p)
	ctx := context.Background()

	t.Run("api", func(t *testing.T) {
		start := time.Now()
		sb := p.create(corral.CreateRequest{Environment: "desktop"})
		png, w, h, err := p.Client.Screenshot(ctx, sb.ID)
		if err != nil {
			t.Fatalf("the first screenshot: %v", err)
		}
		t.Logf("create → first screenshot: %s", time.Since(start))
		if pw, ph := pngSize(t, png); pw != 1024 || ph != 768 || w != 1024 || h != 768 {
			t.Errorf("screenshot %dx%d (headers %dx%d), want 1024x768", pw, ph, w, h)
		}
		// The rest once XFCE is up: its start puts the pointer in the middle of the screen, and
		// its window manager activates the terminal below.
		waitXFCE(t, p, sb.ID)
		t.Logf("create → XFCE up: %s", time.Since(start))
		res, err := p.Client.Input(ctx, sb.ID, corral.InputEvent{Type: corral.InputMove, X: 123, Y: 45})
		if err != nil || res.Events != 1 || res.Width != 1024 || res.Height != 768 {
			t.Fatalf("move: %+v, %v", res, err)
		}
		if got := cursorAt(t, p, sb.ID); got != "x:123 y:45" {
			t.Errorf("after a move to 123,45 the pointer is at %s", got)
		}
		// Typing and keys: a terminal whose shell writes the line typed into it to a file.
		if _, err := p.Client.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"xfce4-terminal", "--disable-server", "--title", "typed-here",
			"-x", "sh", "-c", `read line; echo "$line" > /tmp/typed`}, Env: []string{"DISPLAY=:0"}}); err != nil {
			t.Fatal(err)
		}
		p.sh(sb.ID, "DISPLAY=:0 timeout 30 xdotool search --sync --name typed-here windowactivate --sync")
		if err := p.Client.Type(ctx, sb.ID, "Hello, Corral's desktop!"); err != nil {
			t.Fatal(err)
		}
		if err := p.Client.Key(ctx, sb.ID, "enter"); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "the typed line in /tmp/typed", func() bool {
			out, _, _ := p.run(sb.ID, "cat", "/tmp/typed")
			return out == "Hello, Corral's desktop!\n"
		})
		down := true
		for _, ev := range []corral.InputEvent{{Type: corral.InputClick, X: 600, Y: 500, Count: 2}, {Type: corral.InputScroll, X: 10, Y: 10, Delta: -2},
			{Type: corral.InputButton, X: 20, Y: 20, Down: &down}, {Type: corral.InputKey, Key: "ctrl+shift+F2"}} {
			if _, err := p.Client.Input(ctx, sb.ID, ev); err != nil {
				t.Errorf("input %+v: %v", ev, err)
			}
		}
		// Bad input is refused before anything is sent: the pointer stays.
		for _, bad := range [][]corral.InputEvent{{{Type: corral.InputKey, Key: "hyper"}}, {{Type: corral.InputText, Text: "é"}},
			{{Type: corral.InputMove, X: 1, Y: 1}, {Type: corral.InputClick, X: -1}}, nil} {
			if _, err := p.Client.Input(ctx, sb.ID, bad...); !corral.IsInvalid(err) {
				t.Errorf("input %+v: %v, want invalid", bad, err)
			}
		}
		if got := cursorAt(t, p, sb.ID); got != "x:20 y:20" {
			t.Errorf("after refused input the pointer is at %s, want x:20 y:20", got)
		}

		// A container without a desktop, and a desktop container whose display is gone.
		plain := p.create(corral.CreateRequest{})
		if _, _, _, err := p.Client.Screenshot(ctx, plain.ID); !corral.IsConflict(err) || !strings.Contains(err.Error(), "has no desktop") {
			t.Errorf("a screenshot of a sandbox without a desktop: %v, want a conflict naming why", err)
		}
		if _, err := p.Client.Input(ctx, plain.ID, corral.InputEvent{Type: corral.InputText, Text: "x"}); !corral.IsConflict(err) {
			t.Errorf("input to a sandbox without a desktop: %v, want a conflict", err)
		}
		bare := p.create(corral.CreateRequest{Environment: "desktop"})
		p.sh(bare.ID, "pkill -x Xvfb; while pgrep -x Xvfb >/dev/null; do sleep 0.05; done")
		if _, _, _, err := p.Client.Screenshot(ctx, bare.ID); !corral.IsConflict(err) || !strings.Contains(err.Error(), "no X server answers on :0") {
			t.Errorf("a screenshot without a display: %v, want a conflict naming the display", err)
		}
	})

	t.Run("cli", func(t *testing.T) {
		sb := p.create(corral.CreateRequest{Environment: "desktop"})
		file := filepath.Join(t.TempDir(), "shot.png")
		if _, stderr, code := p.cli("", "screen", sb.ID, "-o", file); code != 0 || !strings.Contains(stderr, "1024x768") {
			t.Fatalf("corral screen: exit %d, %s", code, stderr)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if w, h := pngSize(t, b); w != 1024 || h != 768 {
			t.Errorf("corral screen wrote %dx%d", w, h)
		}
		waitXFCE(t, p, sb.ID)
		if _, stderr, code := p.cli("", "click", sb.ID, "400", "300"); code != 0 {
			t.Fatalf("corral click: exit %d, %s", code, stderr)
		}
		if got := cursorAt(t, p, sb.ID); got != "x:400 y:300" {
			t.Errorf("after corral click 400 300 the pointer is at %s", got)
		}
		for _, args := range [][]string{{"type", sb.ID, "ls", "--enter"}, {"key", sb.ID, "ctrl+alt+d", "esc"}} {
			if _, stderr, code := p.cli("", args...); code != 0 {
				t.Errorf("corral %s: exit %d, %s", args[0], code, stderr)
			}
		}
		plain := p.create(corral.CreateRequest{})
		if _, stderr, code := p.cli("", "screen", plain.ID, "-o", file); code == 0 || !strings.Contains(stderr, "has no desktop") {
			t.Errorf("corral screen of a sandbox without a desktop: exit %d, %s", code, stderr)
		}
	})

	t.Run("e2b-sdk", func(t *testing.T) {
		last := runE2BScript(t, p, e2bAddr, "desktop.mjs", "desktop", randHex(4))
		if last.URL == "" {
			t.Fatal("desktop.mjs printed no stream URL")
		}
		// The stream URL in a real browser: noVNC's page, connected through the gateway's port
		// proxy, draws the desktop on its canvas. The URL's host (6080-ID.e2b.test) resolves to
		// the gateway, over HTTP.
		u, err := url.Parse(last.URL)
		if err != nil {
			t.Fatal(err)
		}
		u.Scheme, u.Host = "http", u.Hostname()+":"+e2bAddr[strings.LastIndexByte(e2bAddr, ':')+1:]
		bctx := newBrowserWith(t, chromedp.Flag("host-resolver-rules", "MAP *.e2b.test 127.0.0.1"))
		// Generous bounds: the page's ~45 ES modules each cross the gateway, Corral's port proxy
		// and websockify (a process forked per connection), ~13 s in all on a busy 2-core host.
		page := tab(t, bctx, 6*time.Minute)
		reqs := watchNet(t, page)
		dir := artifactDir(t)
		start := time.Now()
		nav, cancel := context.WithTimeout(page, 3*time.Minute)
		defer cancel()
		ok(t, "open the stream URL "+u.String(), chromedp.Do(nav, chromedp.Navigate(u.String())))
		t.Logf("the noVNC page loaded in %s", time.Since(start))
		var got string
		deadline := time.Now().Add(2 * time.Minute)
		for reloads := 0; ; {
			// The canvas has the desktop's size once connected, and the desktop's pixels are
			// not all one colour.
			got, err = eval[string](within(t, page), `(() => {
				const c = document.querySelector('#noVNC_container canvas, canvas');
				if (!c || c.width < 2) return 'no canvas';
				const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
				let colours = new Set();
				for (let i = 0; i < d.length && colours.size < 3; i += 4 * 97) colours.add(d[i] << 16 | d[i+1] << 8 | d[i+2]);
				return c.width + 'x' + c.height + ' ' + colours.size + ' colours';
			})()`)
			if err == nil && got == "1024x768 3 colours" || time.Now().After(deadline) {
				break
			}
			if got == "no canvas" && reqs.networkChanged() && reloads < 3 {
				// Not the page's fault: its modules' loads were aborted by the host's network
				// changing under Chromium; load it again.
				reloads++
				t.Logf("a load of the page failed with ERR_NETWORK_CHANGED; loading it again (%d)", reloads)
				ok(t, "open the stream URL again", chromedp.Do(nav, chromedp.Navigate(u.String())))
				deadline = time.Now().Add(2 * time.Minute)
				continue
			}
			time.Sleep(200 * time.Millisecond) // polling the page's state, bounded by deadline
		}
		t.Logf("the noVNC page shows the desktop %s after it was opened", time.Since(start))
		shot(t, page, dir, "novnc")
		if got != "1024x768 3 colours" {
			body, _ := eval[string](within(t, page), `document.body.innerText`)
			t.Fatalf("the noVNC page's canvas: %q (%v); the page reads:\n%s\nits requests:\n%s", got, err, body, reqs)
		}
	})
}

// newBrowserWith is newBrowser with more Chromium options.
func newBrowserWith(t *testing.T, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.WindowSize(1400, 1000),
		chromedp.Flag("disable-dev-shm-usage", true),
	)
	actx, cancel := chromedp.NewExecAllocator(context.Background(), append(opts, extra...)...)
	t.Cleanup(cancel)
	bctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(cancelB)
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return bctx
}
