package runtime

import (
	"context"
	"net"
	"time"
)

// Runtime is what every backend does (the package doc has the lifecycle and errors).
type Runtime interface {
	// Runtimes names what this backend runs: the values of Spec.Runtime it takes, its default
	// first.
	Runtimes() []string
	// Available is nil when sandboxes of the named runtime can be created here, else why not
	// (errdefs.ErrUnavailable).
	Available(runtime string) error
	// Has reports whether id is one of this backend's sandboxes (its state is on the host).
	Has(id string) bool
	Create(ctx context.Context, spec Spec) (*Sandbox, error)
	Open(ctx context.Context, id string) (*Sandbox, error)
	Status(ctx context.Context, id string) (Status, error)
	Delete(ctx context.Context, id string) error
	// Kill ends every process of a sandbox and returns once they are gone; what it leaves
	// (files, mounts, cgroups) Delete removes later.
	Kill(ctx context.Context, id string) error
	List(ctx context.Context) ([]string, error)
	// Close releases what the backend holds in this process; its sandboxes keep running.
	Close() error
}

// Pauser pauses a sandbox so it uses no CPU and gives back what memory it can, and resumes it.
// Pause is all-or-nothing: on error the sandbox runs as before.
type Pauser interface {
	Pause(ctx context.Context, id string) (PauseStats, error)
	Resume(ctx context.Context, id string) (ResumeStats, error)
}

// Snapshotter gives the edge a sandbox's writable layer to read as a directory (UpperDir),
// consistent while the sandbox is frozen (Freeze until Thaw).
type Snapshotter interface {
	Freeze(ctx context.Context, id string) error
	Thaw(ctx context.Context, id string) error
	UpperDir(id string) (string, error)
}

// Forker takes an image of a running sandbox that Create (Spec.Fork) starts copies from; the
// caller must DropFork it once done.
type Forker interface {
	Fork(ctx context.Context, id string, opts ForkOptions) (*ForkImage, error)
	DropFork(img *ForkImage)
}

// UsageReader reads what a sandbox uses now.
type UsageReader interface {
	Usage(id string) (Usage, error)
}

// Machine is a backend of full machines (the vm tier): a screen, keyboard and mouse, power and
// a serial console.
type Machine interface {
	// MachineAvailable is nil when machines (Spec.BootDisk) can be created here, else why not.
	MachineAvailable() error
	// Screen returns a PNG of a machine's display and its size.
	Screen(ctx context.Context, id string) (png []byte, width, height int, err error)
	// Input sends keyboard and mouse events to a machine.
	Input(ctx context.Context, id string, events []InputEvent) (InputResult, error)
	// Power turns a machine off (force: at once) or on, or resets it (action "off", "on" or
	// "reboot", as the API names them).
	Power(ctx context.Context, id, action string, force bool) error
	// Console returns the end of a VM's serial console output, at most limit bytes.
	Console(id string, limit int64) ([]byte, error)
	// VNC connects a new RFB client to a machine's display.
	VNC(ctx context.Context, id string) (net.Conn, error)
	// WaitAgent waits up to timeout for a machine's agent to answer.
	WaitAgent(ctx context.Context, id string, timeout time.Duration) error
}

// DiskHolder reports what a backend's disks hold on the data dir's filesystem beyond its
// sandboxes' limits: promised (made ahead, e.g. a pool of formatted disks) and allocated.
type DiskHolder interface {
	DiskHeld() (promised, allocated int64)
}

// InputEvent is one keyboard or mouse event for Machine.Input: the API's input event (the edge
// converts it; the fields are the same, so a conversion is a type conversion), kept here so the
// contract does not import the SDK.
type InputEvent struct {
	Type   string // "text", "key", "move", "click", "scroll" or "button"
	Text   string
	Key    string
	X, Y   int
	Button string // "left" (the default), "right" or "middle"
	Count  int
	Delta  int
	Down   *bool
}

// The kinds of InputEvent (InputEvent.Type), the API's.
const (
	InputText   = "text"   // type Text on a US keyboard layout
	InputKey    = "key"    // press and release Key, a combination such as "ctrl+alt+t"
	InputMove   = "move"   // move the pointer to X, Y
	InputClick  = "click"  // click Button Count times at X, Y
	InputScroll = "scroll" // scroll Delta steps at X, Y (negative: up)
	InputButton = "button" // press (Down) or release Button at X, Y
)

// The actions of Machine.Power.
const (
	PowerOn     = "on"
	PowerOff    = "off"
	PowerReboot = "reboot"
)

// InputResult is what Machine.Input did: the events sent and the screen size mouse coordinates
// were scaled against.
type InputResult struct {
	Events int
	Width  int
	Height int
}
