package cli

import (
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/lazyregexp"
	corral "github.com/corral-dev/corral/sdk/go"
)

// sgrRE matches the colour sequences of a Jupyter traceback.
var sgrRE = lazyregexp.New("\x1b\\[[0-9;]*m")

// newCodeCmd is `corral code`: run code in a sandbox's code-execution server.
func (a *app) newCodeCmd() *cobra.Command {
	var code, context, timeout, saveImages string
	cmd := &cobra.Command{
		Use:   "code ID [--context C] (-c CODE | FILE | -) [--save-images DIR]",
		Short: "Run code in a code-interpreter sandbox's kernel (state kept between runs)",
		Long: `Run Python code in the stateful Jupyter kernel of a sandbox made from the code-interpreter
environment (corral env install code-interpreter): variables stay between runs of the same
context. What the code prints goes to stdout and stderr, results (the last expression's value,
tables, figures) are printed as text, and images are written to --save-images DIR. An error in
the code prints its traceback and exits 1; --timeout interrupts the kernel (default 5m).`,
		Example: `  corral create --env code-interpreter
  corral code sb-local-... -c 'x = 21'
  corral code sb-local-... -c 'x * 2'
  corral code sb-local-... analysis.py --save-images ./figures`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 || len(args) > 2 {
				return usagef("%s wants a sandbox ID, and a FILE (or - for stdin) unless -c is given; got %d argument(s)", cmd.CommandPath(), len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) == 2 && cmd.Flags().Changed("code"):
				return usagef("give -c CODE or a FILE, not both")
			case len(args) == 1 && !cmd.Flags().Changed("code"):
				return usagef("give the code: -c CODE, a FILE, or - for stdin")
			case len(args) == 2:
				var b []byte
				var err error
				if args[1] == "-" {
					b, err = io.ReadAll(io.LimitReader(a.stdin, 8<<20))
				} else {
					b, err = os.ReadFile(args[1])
				}
				if err != nil {
					return usagef("read the code: %v", err)
				}
				code = string(b)
			}
			if err := checkDuration("timeout", timeout); err != nil {
				return err
			}
			if saveImages != "" {
				if err := os.MkdirAll(saveImages, 0o755); err != nil {
					return fmt.Errorf("--save-images: %w", err)
				}
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			images := 0
			failed := false
			var werr error
			_, err = c.RunCode(cmd.Context(), args[0], corral.CodeRequest{Code: code, Context: context, Timeout: timeout}, func(ev corral.CodeEvent) {
				if werr != nil {
					return
				}
				if a.jsonOut() {
					werr = a.printJSON(ev)
					return
				}
				switch ev.Type {
				case corral.CodeStdout:
					_, werr = io.WriteString(a.stdout, ev.Text)
				case corral.CodeStderr:
					_, werr = io.WriteString(a.stderr, ev.Text)
				case corral.CodeResult:
					werr = a.printCodeResult(ev, saveImages, &images)
				case corral.CodeError:
					failed = true
					tb := sgrRE.ReplaceAllString(ev.Traceback, "")
					if tb == "" {
						tb = ev.Name + ": " + ev.Value
					}
					_, werr = fmt.Fprintln(a.stderr, tb)
				}
			})
			if err != nil {
				return err
			}
			if werr != nil {
				return werr
			}
			if failed {
				return exitError{1}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&code, "code", "c", "", "the code to run")
	f.StringVar(&context, "context", "", "a context's ID (default: the sandbox's default context)")
	f.StringVar(&timeout, "timeout", "", "interrupt the kernel after this long (default 5m)")
	f.StringVar(&saveImages, "save-images", "", "write the results' images (png, jpeg, svg) to this directory")
	return cmd
}

// printCodeResult prints a result's text and saves its images under dir (when set).
func (a *app) printCodeResult(ev corral.CodeEvent, dir string, n *int) error {
	type image struct {
		ext, data string
		b64       bool
	}
	var imgs []image
	if ev.PNG != "" {
		imgs = append(imgs, image{"png", ev.PNG, true})
	}
	if ev.JPEG != "" {
		imgs = append(imgs, image{"jpeg", ev.JPEG, true})
	}
	if ev.SVG != "" {
		imgs = append(imgs, image{"svg", ev.SVG, false})
	}
	for _, im := range imgs {
		if dir == "" {
			if _, err := fmt.Fprintf(a.stdout, "[%s image: --save-images DIR writes it]\n", im.ext); err != nil {
				return err
			}
			continue
		}
		b := []byte(im.data)
		if im.b64 {
			var err error
			if b, err = base64.StdEncoding.DecodeString(im.data); err != nil {
				return fmt.Errorf("decode a %s result: %w", im.ext, err)
			}
		}
		*n++
		p := filepath.Join(dir, fmt.Sprintf("result-%d.%s", *n, im.ext))
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
		if _, err := fmt.Fprintf(a.stdout, "[%s image saved to %s]\n", im.ext, p); err != nil {
			return err
		}
	}
	if ev.Text != "" && (len(imgs) == 0 || ev.IsMainResult) {
		_, err := fmt.Fprintln(a.stdout, ev.Text)
		return err
	}
	return nil
}
