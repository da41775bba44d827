package qemu

import (
	"github.com/corral-dev/corral/internal/computeruse"
	"github.com/corral-dev/corral/internal/runtime"
)

// Bounds of one Input call (computeruse's, shared with container desktops).
const (
	MaxInputEvents = computeruse.MaxInputEvents
	MaxInputText   = computeruse.MaxInputText
)

// The events' validation and key names are computeruse's: the API's key names are QEMU's
// QKeyCodes, which sendInput passes as they are.
func textKeys(s string) ([][]string, error)        { return computeruse.TextKeys(s) }
func parseCombo(combo string) ([]string, error)    { return computeruse.ParseCombo(combo) }
func checkInput(events []runtime.InputEvent) error { return computeruse.CheckInput(events) }

// buttons maps the API's mouse buttons to QEMU's InputButton.
var buttons = computeruse.Buttons

// absAxis scales a pixel coordinate to the tablet's 0-32767 axis over a screen of size pixels.
func absAxis(v, size int) int {
	if size <= 1 {
		return 0
	}
	if v >= size {
		v = size - 1
	}
	return v * 0x7fff / (size - 1)
}
