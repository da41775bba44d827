package computeruse

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/doccheck"
	"github.com/corral-dev/corral/internal/runtime"
)

func TestXKeysym(t *testing.T) {
	for in, want := range map[string]string{
		"ctrl+alt+t": "Control_L+Alt_L+t", "Enter": "Return", "super": "Super_L", "F2": "F2", "shift+Tab": "Shift_L+Tab",
		"+": "Shift_L+equal", "ctrl+/": "Control_L+slash", "pgdn": "Next", "kp_5": "KP_5", "kp_enter": "KP_Enter", "esc": "Escape",
	} {
		keys, err := ParseCombo(in)
		if err != nil {
			t.Fatalf("ParseCombo(%q): %v", in, err)
		}
		for i, k := range keys {
			keys[i] = XKeysym(k)
		}
		if got := strings.Join(keys, "+"); got != want {
			t.Errorf("%q: %s, want %s", in, got, want)
		}
	}
}

// TestInputScript: the script is valid sh, sends each event with xdotool in order, quotes
// text as one word, and ends with the display's size; bad events make no script.
func TestInputScript(t *testing.T) {
	down := false
	s, err := InputScript([]runtime.InputEvent{{Type: "text", Text: "it's $HOME `x`\n"}, {Type: "key", Key: "ctrl+c"}, {Type: "move", X: 1, Y: 2},
		{Type: "click", X: 3, Y: 4, Button: "right", Count: 2}, {Type: "scroll", X: 5, Y: 6, Delta: -3}, {Type: "button", X: 7, Y: 8, Down: &down}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"xdotool type --delay 8 -- 'it'\"'\"'s $HOME `x`\n'\n", "xdotool key -- 'Control_L+c'\n", "xdotool mousemove --sync 1 2\n",
		"xdotool mousemove --sync 3 4 click --repeat 2 3\n", "xdotool mousemove --sync 5 6 click --repeat 3 4\n",
		"xdotool mousemove --sync 7 8 mouseup 1\n", "xdotool getdisplaygeometry\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("the script lacks %q:\n%s", want, s)
		}
	}
	if err := exec.Command("sh", "-n", "-c", s).Run(); err != nil {
		t.Errorf("sh -n: %v\n%s", err, s)
	}
	if _, err := InputScript([]runtime.InputEvent{{Type: "move"}, {Type: "key", Key: "hyper"}}); err == nil {
		t.Error("a bad event made a script")
	}
}

func TestParseGeometry(t *testing.T) {
	if w, h, err := ParseGeometry([]byte("1024 768\n")); w != 1024 || h != 768 || err != nil {
		t.Errorf("ParseGeometry = %d, %d, %v", w, h, err)
	}
	for _, bad := range []string{"", "1024", "a b", "0 768"} {
		if _, _, err := ParseGeometry([]byte(bad)); err == nil {
			t.Errorf("ParseGeometry(%q) accepted", bad)
		}
	}
}

func TestPNGSize(t *testing.T) {
	b := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00\x04\x00\x00\x00\x03\x00")
	if w, h, err := PNGSize(b); w != 1024 || h != 768 || err != nil {
		t.Errorf("PNGSize = %d, %d, %v", w, h, err)
	}
	if _, _, err := PNGSize([]byte("GIF89a")); err == nil {
		t.Error("PNGSize accepted a GIF")
	}
}

func TestDocComments(t *testing.T) { doccheck.Exported(t, ".") }
