package computeruse

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/corral-dev/corral/internal/runtime"
)

// An X display inside a sandbox is reached by running a script there (sh -c) as the sandbox's
// user: scrot takes the screenshot, xdotool sends the input and reports the screen's size. The
// display is $DISPLAY as the sandbox's environment sets it, else :0 (where the desktop recipe
// starts Xvfb, as E2B's desktop SDK does).

// Exit statuses of the scripts that mean the sandbox has no display to drive.
const (
	// ExitNoTools: scrot or xdotool is not installed.
	ExitNoTools = 90
	// ExitNoDisplay: no X server answers on the display (named on stderr).
	ExitNoDisplay = 91
	// ExitNoVNC: x11vnc is not installed (VNCScript).
	ExitNoVNC = 92
)

// preamble checks for the tools and the display; it leaves the display in $DISPLAY. A display
// that is starting (an Xvfb process, or the desktop recipe's start script, corral-desktop, which
// the sandbox's create started a moment ago) is waited for, 10 s at most; none is a conflict at
// once.
var preamble = fmt.Sprintf(`command -v xdotool >/dev/null 2>&1 && command -v scrot >/dev/null 2>&1 || exit %d
export DISPLAY="${DISPLAY:-:0}"
i=0
until err=$(xdotool getdisplaygeometry 2>&1 >/dev/null); do
  i=$((i + 1))
  if [ $i -gt 500 ] || ! { pgrep -x Xvfb || pgrep -f '^/bin/sh /opt/corral/desktop/corral-desktop'; } >/dev/null 2>&1; then
    echo "$DISPLAY" >&2; echo "$err" >&2; ps -eo pid,stat,args >&2; exit %d
  fi
  sleep 0.02
done
`, ExitNoTools, ExitNoDisplay)

// ScreenScript writes a PNG of the display, the pointer drawn in, to stdout.
var ScreenScript = preamble + `f=/tmp/.corral-screen-$$.png
rm -f "$f"
# A session that is starting may refuse a client a moment: scrot is tried three times.
for n in 1 2 3; do scrot --pointer "$f" && break; sleep 0.1; done
cat "$f"
rc=$?
rm -f "$f"
exit $rc
`

// xkeys maps the API's key names (QKeyCodes, after ParseCombo) to X keysyms where they differ;
// letters, digits and f1-f12 are keysyms already (function keys upper-cased).
var xkeys = map[string]string{
	"shift": "Shift_L", "shift_r": "Shift_R", "alt": "Alt_L", "alt_r": "Alt_R", "ctrl": "Control_L",
	"ctrl_r": "Control_R", "menu": "Menu", "esc": "Escape", "ret": "Return", "spc": "space", "tab": "Tab",
	"backspace": "BackSpace", "minus": "minus", "equal": "equal", "bracket_left": "bracketleft",
	"bracket_right": "bracketright", "semicolon": "semicolon", "apostrophe": "apostrophe",
	"grave_accent": "grave", "backslash": "backslash", "comma": "comma", "dot": "period", "slash": "slash",
	"caps_lock": "Caps_Lock", "num_lock": "Num_Lock", "scroll_lock": "Scroll_Lock", "print": "Print",
	"sysrq": "Sys_Req", "pause": "Pause", "insert": "Insert", "delete": "Delete", "home": "Home", "end": "End",
	"pgup": "Prior", "pgdn": "Next", "up": "Up", "down": "Down", "left": "Left", "right": "Right",
	"meta_l": "Super_L", "meta_r": "Super_R", "kp_add": "KP_Add", "kp_subtract": "KP_Subtract",
	"kp_multiply": "KP_Multiply", "kp_divide": "KP_Divide", "kp_enter": "KP_Enter", "kp_decimal": "KP_Decimal",
	"less": "less",
}

// XKeysym returns the X keysym of a QKeyCode that ParseCombo returned.
func XKeysym(code string) string {
	if k, ok := xkeys[code]; ok {
		return k
	}
	if strings.HasPrefix(code, "kp_") {
		return "KP_" + code[3:]
	}
	if len(code) > 1 && code[0] == 'f' {
		return "F" + code[1:]
	}
	return code
}

// XButtons numbers the API's mouse buttons as X does.
var XButtons = map[string]int{"": 1, "left": 1, "middle": 2, "right": 3}

// typeDelay is xdotool's pause between typed keys (its default is 12 ms).
const typeDelay = 8

// InputScript returns the script that sends events, in order, to the display and then prints
// its size ("W H", xdotool getdisplaygeometry) as its last line of output. The events are
// checked first (CheckInput): nothing is sent when one is invalid.
func InputScript(events []runtime.InputEvent) (string, error) {
	if err := CheckInput(events); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(preamble)
	b.WriteString("set -e\n")
	at := func(e runtime.InputEvent) string { return fmt.Sprintf("mousemove --sync %d %d", e.X, e.Y) }
	for _, e := range events {
		b.WriteString("xdotool ")
		switch e.Type {
		case runtime.InputText:
			fmt.Fprintf(&b, "type --delay %d -- %s", typeDelay, shellQuote(e.Text))
		case runtime.InputKey:
			keys, _ := ParseCombo(e.Key)
			for i, k := range keys {
				keys[i] = XKeysym(k)
			}
			b.WriteString("key -- " + shellQuote(strings.Join(keys, "+")))
		case runtime.InputMove:
			b.WriteString(at(e))
		case runtime.InputClick:
			fmt.Fprintf(&b, "%s click --repeat %d %d", at(e), max(e.Count, 1), XButtons[e.Button])
		case runtime.InputScroll:
			wheel, n := 5, e.Delta
			if n < 0 {
				wheel, n = 4, -n
			}
			fmt.Fprintf(&b, "%s click --repeat %d %d", at(e), n, wheel)
		case runtime.InputButton:
			op := "mouseup"
			if *e.Down {
				op = "mousedown"
			}
			fmt.Fprintf(&b, "%s %s %d", at(e), op, XButtons[e.Button])
		}
		b.WriteString("\n")
	}
	b.WriteString("xdotool getdisplaygeometry\n")
	return b.String(), nil
}

// ParseGeometry reads the size InputScript prints last.
func ParseGeometry(out []byte) (width, height int, err error) {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(f) == 2 {
		width, err = strconv.Atoi(f[0])
		if err == nil {
			height, err = strconv.Atoi(f[1])
		}
		if err == nil && width > 0 && height > 0 {
			return width, height, nil
		}
	}
	return 0, 0, fmt.Errorf("xdotool getdisplaygeometry printed %q", lines[len(lines)-1])
}

// PNGSize reads a PNG's width and height from its header.
func PNGSize(b []byte) (width, height int, err error) {
	if len(b) < 24 || string(b[:8]) != "\x89PNG\r\n\x1a\n" || string(b[12:16]) != "IHDR" {
		return 0, 0, errors.New("not a PNG")
	}
	return int(binary.BigEndian.Uint32(b[16:])), int(binary.BigEndian.Uint32(b[20:])), nil
}

// shellQuote quotes s for sh as one word.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'"'"'`) + "'"
}

// VNCPort is the loopback port inside a sandbox where VNCScript serves its X display as RFB
// (x11vnc's default, and where E2B's desktop SDK starts it too).
const VNCPort = 5900

// VNCScript starts x11vnc on the display, serving RFB on 127.0.0.1:VNCPort to any number of
// viewers until the sandbox ends, unless an x11vnc runs already (the edge runs it only when
// nothing answers on the port). It asks no password: only the sandbox's own processes reach its
// loopback, and Corral's API (a token with sandbox.use) is the check for everyone else (GET
// /v1/sandboxes/{id}/vnc). x11vnc -bg returns once it listens.
var VNCScript = preamble + fmt.Sprintf(`command -v x11vnc >/dev/null 2>&1 || exit %d
pgrep -x x11vnc >/dev/null 2>&1 && exit 0
x11vnc -display "$DISPLAY" -rfbport %d -localhost -forever -shared -nopw -nolookup -bg -quiet -o /tmp/x11vnc.log >/dev/null 2>&1 ||
  pgrep -x x11vnc >/dev/null 2>&1 || { tail -5 /tmp/x11vnc.log >&2; exit 1; }
`, ExitNoVNC, VNCPort)
