// Package computeruse owns the keyboard and mouse events of Corral's computer-use API (POST
// /v1/sandboxes/{id}/input): their validation and key names, shared by the two displays an
// agent drives. The vm tier's display is QEMU's (internal/runtime/qemu sends the events as QMP
// input events, its keys QEMU's QKeyCodes, the names used here); a container or microvm
// sandbox's display is an X server inside it (the desktop recipe's Xvfb), driven with xdotool
// and seen with scrot, through scripts this package writes (xdotool.go).
package computeruse

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime"
)

// Bounds of one Input call.
const (
	MaxInputEvents = 256
	// MaxInputText bounds the text of one call: about 20 ms a key, so at most ~20 s of typing.
	MaxInputText = 1024
)

// keyAliases maps the friendly key names a combination may use to QEMU's QKeyCodes.
var keyAliases = map[string]string{
	"enter": "ret", "return": "ret", "escape": "esc", "space": "spc", "del": "delete", "ins": "insert",
	"pageup": "pgup", "pagedown": "pgdn", "control": "ctrl", "lctrl": "ctrl", "rctrl": "ctrl_r",
	"super": "meta_l", "win": "meta_l", "meta": "meta_l", "cmd": "meta_l", "lalt": "alt", "ralt": "alt_r",
	"altgr": "alt_r", "lshift": "shift", "rshift": "shift_r", "bksp": "backspace", "printscreen": "print",
	"capslock": "caps_lock", "numlock": "num_lock", "scrolllock": "scroll_lock", "menu": "menu",
	"-": "minus", "=": "equal", "[": "bracket_left", "]": "bracket_right", ";": "semicolon",
	"'": "apostrophe", "`": "grave_accent", "\\": "backslash", ",": "comma", ".": "dot", "/": "slash",
}

// qcodes are the QKeyCodes Input accepts in a combination (QEMU's qapi/ui.json, the keys of a
// PC keyboard).
var qcodes = func() map[string]bool {
	m := map[string]bool{}
	for _, k := range strings.Fields(`shift shift_r alt alt_r ctrl ctrl_r menu esc ret spc tab backspace
		minus equal bracket_left bracket_right semicolon apostrophe grave_accent backslash comma dot slash
		caps_lock num_lock scroll_lock print sysrq pause insert delete home end pgup pgdn
		up down left right meta_l meta_r kp_0 kp_1 kp_2 kp_3 kp_4 kp_5 kp_6 kp_7 kp_8 kp_9
		kp_add kp_subtract kp_multiply kp_divide kp_enter kp_decimal less`) {
		m[k] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		m[string(c)] = true
	}
	for c := '0'; c <= '9'; c++ {
		m[string(c)] = true
	}
	for i := 1; i <= 12; i++ {
		m["f"+strconv.Itoa(i)] = true
	}
	return m
}()

// shifted maps the characters a US keyboard types with shift to their unshifted key.
var shifted = map[rune]string{
	'!': "1", '@': "2", '#': "3", '$': "4", '%': "5", '^': "6", '&': "7", '*': "8", '(': "9", ')': "0",
	'_': "minus", '+': "equal", '{': "bracket_left", '}': "bracket_right", ':': "semicolon",
	'"': "apostrophe", '~': "grave_accent", '|': "backslash", '<': "comma", '>': "dot", '?': "slash",
}

// plain maps the other printable characters to their key.
var plain = map[rune]string{
	' ': "spc", '\n': "ret", '\t': "tab", '-': "minus", '=': "equal", '[': "bracket_left",
	']': "bracket_right", ';': "semicolon", '\'': "apostrophe", '`': "grave_accent", '\\': "backslash",
	',': "comma", '.': "dot", '/': "slash",
}

// TextKeys returns the key presses (each a list of QKeyCodes held together) that type s on a US
// layout. Only printable ASCII, newline (Enter) and tab can be typed.
func TextKeys(s string) ([][]string, error) {
	var out [][]string
	for i, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			out = append(out, []string{string(c)})
		case c >= 'A' && c <= 'Z':
			out = append(out, []string{"shift", string(c - 'A' + 'a')})
		case shifted[c] != "":
			out = append(out, []string{"shift", shifted[c]})
		case plain[c] != "":
			out = append(out, []string{plain[c]})
		default:
			return nil, errdefs.Invalid("text", "character %q at byte %d cannot be typed: text is printable ASCII, newline and tab (use key events for other keys)", c, i)
		}
	}
	return out, nil
}

// ParseCombo turns "ctrl+alt+t" (or a single key, "ret", "f2") into QKeyCodes, pressed in
// order and released in reverse. Names compare case-insensitively; "+" alone is the plus key.
func ParseCombo(combo string) ([]string, error) {
	s := strings.ToLower(strings.TrimSpace(combo))
	if s == "" {
		return nil, errdefs.Invalid("key", "empty key combination")
	}
	var parts []string
	if s == "+" {
		parts = []string{"shift", "equal"}
	} else {
		for _, p := range strings.Split(s, "+") {
			if p == "" {
				return nil, errdefs.Invalid("key", "%q: an empty key between '+'", combo)
			}
			parts = append(parts, p)
		}
	}
	if len(parts) > 8 {
		return nil, errdefs.Invalid("key", "%q: at most 8 keys at once", combo)
	}
	out := make([]string, 0, len(parts))
	for _, p := range parts {
		k := p
		if a, ok := keyAliases[p]; ok {
			k = a
		}
		if !qcodes[k] {
			return nil, errdefs.Invalid("key", "%q: unknown key %q (letters, digits, f1-f12, ctrl, alt, shift, super, ret, esc, tab, spc, backspace, delete, up, down, left, right, home, end, pgup, pgdn, ...)", combo, p)
		}
		out = append(out, k)
	}
	return out, nil
}

// Buttons maps the API's mouse buttons to QEMU's InputButton names (xdotool numbers them: XButtons).
var Buttons = map[string]string{"": "left", "left": "left", "right": "right", "middle": "middle"}

// CheckInput validates a list of input events before any is sent.
func CheckInput(events []runtime.InputEvent) error {
	if len(events) == 0 {
		return errdefs.Invalid("events", "no events")
	}
	if len(events) > MaxInputEvents {
		return errdefs.Invalid("events", "%d events, at most %d per call", len(events), MaxInputEvents)
	}
	text := 0
	for i, e := range events {
		field := fmt.Sprintf("events[%d]", i)
		switch e.Type {
		case runtime.InputText:
			text += len(e.Text)
			if text > MaxInputText {
				return errdefs.Invalid(field+".text", "more than %d bytes of text in one call", MaxInputText)
			}
			if _, err := TextKeys(e.Text); err != nil {
				return errdefs.Invalid(field+".text", "%v", err)
			}
		case runtime.InputKey:
			if _, err := ParseCombo(e.Key); err != nil {
				return errdefs.Invalid(field+".key", "%v", err)
			}
		case runtime.InputMove, runtime.InputClick, runtime.InputScroll, runtime.InputButton:
			if e.X < 0 || e.Y < 0 || e.X > 16384 || e.Y > 16384 {
				return errdefs.Invalid(field, "x=%d y=%d: want 0 to 16384", e.X, e.Y)
			}
			if _, ok := Buttons[e.Button]; !ok {
				return errdefs.Invalid(field+".button", "%q: want left, right or middle", e.Button)
			}
			if e.Type == runtime.InputClick && (e.Count < 0 || e.Count > 3) {
				return errdefs.Invalid(field+".count", "%d: want 1 to 3 (0 is 1)", e.Count)
			}
			if e.Type == runtime.InputScroll && (e.Delta == 0 || e.Delta < -100 || e.Delta > 100) {
				return errdefs.Invalid(field+".delta", "%d: want -100 to 100 steps, not 0 (negative scrolls up)", e.Delta)
			}
			if e.Type == runtime.InputButton && e.Down == nil {
				return errdefs.Invalid(field+".down", "a button event says down (true) or up (false)")
			}
		default:
			return errdefs.Invalid(field+".type", "%q: want text, key, move, click, scroll or button", e.Type)
		}
	}
	return nil
}
