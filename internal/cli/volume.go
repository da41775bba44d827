package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	corral "github.com/corral-dev/corral/sdk/go"
)

func (a *app) newVolumeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "volume",
		Short: "Volumes: filesystems that outlive sandboxes (datasets, caches, a home)",
		Args:  exactArgs(0, "a subcommand: create, ls, get or rm"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmd.Help()
		},
	}
	var project, size string
	create := &cobra.Command{
		Use:   "create NAME --size SIZE [--project P]",
		Short: "Make a volume of SIZE, charged to the project's disk quota",
		Example: `  corral volume create data --size 10G
  corral create --volume data:/data          # read-write: one sandbox at a time
  corral create --volume data:/data:ro       # read-only: any number at once`,
		Args: exactArgs(1, "a volume NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if size == "" {
				return usagef("--size is required, e.g. --size 10G")
			}
			n, err := parseSize(size)
			if err != nil {
				return usagef("--size: %v", err)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			v, err := c.CreateVolume(cmd.Context(), corral.CreateVolumeRequest{Name: args[0], SizeBytes: n, Project: project})
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(v)
			}
			_, err = fmt.Fprintln(a.stdout, v.Name)
			return err
		},
	}
	create.Flags().StringVar(&size, "size", "", "the volume's size, e.g. 10G (allocated in full)")
	create.Flags().StringVar(&project, "project", "", "project that owns the volume (default: the token's)")
	ls := &cobra.Command{
		Use:   "ls [--project P]",
		Short: "List the volumes of a project's subtree",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.Volumes(cmd.Context(), project)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(list)
			}
			t := newTable(a.stdout)
			t.row("NAME", "PROJECT", "SIZE", "ATTACHED", "NODE", "CREATED")
			for _, v := range list {
				t.row(v.Name, orDash(v.Project), formatBytes(v.SizeBytes), orDash(attachments(v.AttachedTo)), v.Node, formatTime(v.CreatedAt, a.now()))
			}
			return t.flush()
		},
	}
	ls.Flags().StringVar(&project, "project", "", "list under this project (default: the token's)")
	get := &cobra.Command{
		Use:   "get NAME [--project P]",
		Short: "Show a volume and the sandboxes it is mounted into",
		Args:  exactArgs(1, "a volume NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			v, err := c.Volume(cmd.Context(), project, args[0])
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(v)
			}
			_, err = fmt.Fprintf(a.stdout, "Name:       %s\nProject:    %s\nSize:       %s\nNode:       %s\nAttached:   %s\nCreated:    %s\n",
				v.Name, orDash(v.Project), formatBytes(v.SizeBytes), v.Node, orDash(attachments(v.AttachedTo)), formatTime(v.CreatedAt, a.now()))
			return err
		},
	}
	get.Flags().StringVar(&project, "project", "", "the volume's project (default: the token's)")
	rm := &cobra.Command{
		Use:   "rm NAME [--project P]",
		Short: "Delete a volume and its data (refused while a sandbox has it mounted)",
		Args:  exactArgs(1, "a volume NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.DeleteVolume(cmd.Context(), project, args[0])
		},
	}
	rm.Flags().StringVar(&project, "project", "", "the volume's project (default: the token's)")
	cmd.AddCommand(create, ls, get, rm)
	return cmd
}

// attachments is a volume's attachments as "sb-...(ro), sb-...".
func attachments(as []corral.VolumeAttachment) string {
	var out []string
	for _, a := range as {
		s := a.Sandbox
		if a.ReadOnly {
			s += " (ro)"
		}
		out = append(out, s)
	}
	return strings.Join(out, ", ")
}
