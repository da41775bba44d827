package cli

import (
	"fmt"
	"io"
	"net"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/vmimage"
	corral "github.com/corral-dev/corral/sdk/go"
)

// newVMImageCmd returns `corral vm-image`: build or import the disk images of vm sandboxes.
func (a *app) newVMImageCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "vm-image",
		Short: "Build or import disk images for vm sandboxes (layers of kind vm-image)",
		Args:  exactArgs(0, "a subcommand: build or import"),
		RunE:  func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	var project string
	var private bool
	build := &cobra.Command{
		Use:   "build NAME:VERSION",
		Short: "Build the project's Debian vm image (once; cached in /var/cache/corral/vm-image) and publish it",
		Long: `Build the project's own Debian disk image for vm sandboxes on this machine and publish it
as the vm-image layer NAME:VERSION. Needs root and Debian's mirror (debootstrap); the image is
cached by its recipe, so a later build publishes at once. The image boots with GRUB on SeaBIOS to a
root shell on the screen, and starts corral-agent when Corral attaches it.`,
		Args: exactArgs(1, "the layer NAME:VERSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, version, err := splitRef(args[0])
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			path, err := vmimage.Build(cmd.Context(), a.stderr)
			if err != nil {
				return err
			}
			return a.publishVMImage(cmd, c, name, version, path, "qcow2", project, private)
		},
	}
	imp := &cobra.Command{
		Use:   "import NAME:VERSION FILE",
		Short: "Publish a disk image (qcow2 or raw, standing alone) as the vm-image layer NAME:VERSION",
		Args:  exactArgs(2, "the layer NAME:VERSION and the image file"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, version, err := splitRef(args[0])
			if err != nil {
				return err
			}
			format, err := vmimage.Detect(args[1])
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			return a.publishVMImage(cmd, c, name, version, args[1], format, project, private)
		},
	}
	for _, c := range []*cobra.Command{build, imp} {
		c.Flags().StringVar(&project, "project", "", "publish in this project (default: the token's)")
		c.Flags().BoolVar(&private, "private", false, "usable in its project only, not in the projects below it")
	}
	cmd.AddCommand(build, imp)
	return cmd
}

func (a *app) publishVMImage(cmd *cobra.Command, c *corral.Client, name, version, path, format, project string, private bool) error {
	r, size, err := vmimage.Tar(path, format)
	if err != nil {
		return err
	}
	defer r.Close()
	fmt.Fprintf(a.stderr, "publishing %s (%s, %s) as %s:%s\n", path, format, formatBytes(size), name, version)
	l, err := c.ImportLayerWith(cmd.Context(), name, version, corral.KindVMImage, corral.ImportOptions{Project: project, Private: private}, r)
	if err != nil {
		return err
	}
	if a.jsonOut() {
		return a.printJSON(l)
	}
	fmt.Fprintf(a.stdout, "%s:%s %s %s\n", l.Name, l.Version, l.Kind, l.Digest)
	return nil
}

// newScreenCmd returns `corral screen ID -o FILE.png`.
func (a *app) newScreenCmd() *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "screen ID --file FILE.png",
		Short: "Save a screenshot (PNG) of a sandbox's display (a vm's, or a desktop container's)",
		Long: `Save a screenshot (PNG) of a sandbox's display to FILE ("-" writes it to stdout): a vm
sandbox's machine display, or the X display in a container or microvm sandbox (the desktop
environment's: corral env install desktop).
The global -o/--output flag names the file here when it is not table or json:
  corral screen ID -o shot.png`,
		Args: exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if file == "" && a.output != "table" && a.output != "json" {
				file = a.output
			}
			if file == "" {
				return usagef("name the PNG file: corral screen %s -o shot.png", args[0])
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			png, w, h, err := c.Screenshot(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if file == "-" {
				_, err = a.stdout.Write(png)
				return err
			}
			if err := os.WriteFile(file, png, 0o644); err != nil {
				return err
			}
			fmt.Fprintf(a.stderr, "%s: %dx%d, %s\n", file, w, h, formatBytes(int64(len(png))))
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "the PNG file to write (\"-\": stdout)")
	return cmd
}

// newTypeCmd returns `corral type ID TEXT`.
func (a *app) newTypeCmd() *cobra.Command {
	var enter bool
	cmd := &cobra.Command{
		Use:   "type ID TEXT",
		Short: "Type text on a sandbox's keyboard (US layout; --enter presses Enter after it)",
		Args:  exactArgs(2, "a sandbox ID and the text"),
		RunE: func(cmd *cobra.Command, args []string) error {
			events := []corral.InputEvent{{Type: corral.InputText, Text: args[1]}}
			if enter {
				events = append(events, corral.InputEvent{Type: corral.InputKey, Key: "ret"})
			}
			return a.sendInput(cmd, args[0], events)
		},
	}
	cmd.Flags().BoolVar(&enter, "enter", false, "press Enter after the text")
	return cmd
}

// newKeyCmd returns `corral key ID COMBO...`.
func (a *app) newKeyCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "key ID COMBO...",
		Short: "Press key combinations on a sandbox's keyboard, e.g. ctrl+alt+t, ret, f2",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var events []corral.InputEvent
			for _, k := range args[1:] {
				events = append(events, corral.InputEvent{Type: corral.InputKey, Key: k})
			}
			return a.sendInput(cmd, args[0], events)
		},
	}
}

// newClickCmd returns `corral click ID X Y`.
func (a *app) newClickCmd() *cobra.Command {
	var button string
	var count int
	cmd := &cobra.Command{
		Use:   "click ID X Y",
		Short: "Click a mouse button at X, Y (screen pixels from the top left) on a sandbox's display",
		Args:  exactArgs(3, "a sandbox ID and the X and Y pixel"),
		RunE: func(cmd *cobra.Command, args []string) error {
			x, err1 := strconv.Atoi(args[1])
			y, err2 := strconv.Atoi(args[2])
			if err1 != nil || err2 != nil || x < 0 || y < 0 {
				return usagef("X and Y are pixels, whole numbers from 0: got %q %q", args[1], args[2])
			}
			return a.sendInput(cmd, args[0], []corral.InputEvent{{Type: corral.InputClick, X: x, Y: y, Button: button, Count: count}})
		},
	}
	cmd.Flags().StringVar(&button, "button", "left", "left, right or middle")
	cmd.Flags().IntVar(&count, "count", 1, "clicks (2: a double click)")
	return cmd
}

func (a *app) sendInput(cmd *cobra.Command, id string, events []corral.InputEvent) error {
	c, err := a.client()
	if err != nil {
		return err
	}
	res, err := c.Input(cmd.Context(), id, events...)
	if err != nil {
		return err
	}
	if a.jsonOut() {
		return a.printJSON(res)
	}
	return nil
}

// newPowerCmd returns `corral power ID on|off|reboot`.
func (a *app) newPowerCmd() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "power ID on|off|reboot",
		Short: "Power a vm sandbox's machine off (ACPI; --force pulls the plug) or on, or reset it",
		Args:  exactArgs(2, "a sandbox ID and on, off or reboot"),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch args[1] {
			case corral.PowerOn, corral.PowerOff, corral.PowerReboot:
			default:
				return usagef("%q: want on, off or reboot", args[1])
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.Power(cmd.Context(), args[0], corral.PowerRequest{Action: args[1], Force: force})
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(sb)
			}
			fmt.Fprintln(a.stdout, sb.ID+" "+sb.State)
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "with off: end the machine at once instead of asking its guest to shut down")
	return cmd
}

// newConsoleCmd returns `corral console ID`: the end of a VM's serial console.
func (a *app) newConsoleCmd() *cobra.Command {
	var n int64
	cmd := &cobra.Command{
		Use:   "console ID",
		Short: "Print the end of a VM's serial console output (boot messages; works without the agent)",
		Args:  exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			b, err := c.Console(cmd.Context(), args[0], n)
			if err != nil {
				return err
			}
			_, err = a.stdout.Write(b)
			return err
		},
	}
	cmd.Flags().Int64Var(&n, "bytes", 64<<10, "how much of the end to print (at most 1 MiB)")
	return cmd
}

// newVNCCmd returns `corral vnc ID [--listen ADDR]`: a local VNC server address for a vm's display.
func (a *app) newVNCCmd() *cobra.Command {
	var listen string
	var allowRemote bool
	cmd := &cobra.Command{
		Use:   "vnc ID [--listen ADDR]",
		Short: "Serve a vm sandbox's display to VNC viewers on a local address (through the API)",
		Long: `Listen on a local address and connect each VNC viewer that connects there to the vm's display,
through the API (GET /v1/sandboxes/ID/vnc, which needs sandbox.use): the node serves the display
on no port of its own. The local address asks no password: anyone who can connect to it drives the
machine, so it is loopback only unless --allow-remote. Stops with Ctrl-C.`,
		Example: `  corral vnc sb-local-... --listen 127.0.0.1:5901   # then: vncviewer 127.0.0.1:5901`,
		Args:    exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			host, _, err := net.SplitHostPort(listen)
			if err != nil {
				return usagef("--listen %q: want HOST:PORT", listen)
			}
			if ip := net.ParseIP(host); !allowRemote && (ip == nil || !ip.IsLoopback()) && host != "localhost" {
				return usagef("--listen %s: the VNC address asks no password (the API token is the check), so it stays on loopback; --allow-remote serves it elsewhere", listen)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if _, err := c.GetSandbox(cmd.Context(), args[0]); err != nil {
				return err
			}
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", listen, err)
			}
			go func() {
				<-cmd.Context().Done()
				lis.Close()
			}()
			fmt.Fprintf(a.stderr, "VNC for %s on %s, without a password: anyone who can connect there drives the machine (Ctrl-C stops)\n", args[0], lis.Addr())
			for {
				conn, err := lis.Accept()
				if err != nil {
					if cmd.Context().Err() != nil {
						return nil
					}
					return err
				}
				go func() {
					defer conn.Close()
					up, err := c.VNC(cmd.Context(), args[0])
					if err != nil {
						fmt.Fprintf(a.stderr, "vnc: %v\n", err)
						return
					}
					defer up.Close()
					done := make(chan struct{}, 2)
					go func() { io.Copy(up, conn); done <- struct{}{} }()
					go func() { io.Copy(conn, up); done <- struct{}{} }()
					<-done
				}()
			}
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:5900", "local address VNC viewers connect to (loopback unless --allow-remote)")
	cmd.Flags().BoolVar(&allowRemote, "allow-remote", false, "allow a non-loopback --listen address (no password protects it)")
	return cmd
}
