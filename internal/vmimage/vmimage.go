// Package vmimage builds the project's own Debian disk image for vm sandboxes and streams a disk
// image as a vm-image layer.
//
// Build runs build.sh (embedded here; as root): debootstrap of Debian with its generic kernel,
// GRUB on an MBR disk, a root shell on the screen's first console, and corral-agent.service,
// which udev starts when the host attaches the agent's disk (serial corral-agent). The qcow2 it
// makes is cached under /var/cache/corral/vm-image/<key>/, keyed by its inputs, so a machine
// pays for the build once.
package vmimage

import (
	"archive/tar"
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/vmdisk"
)

//go:embed build.sh
var script []byte

// Script returns build.sh, the recipe Build runs.
func Script() []byte { return script }

// Build builds (or finds in the cache) the Debian vm image and returns the path of its
// disk.qcow2. Progress goes to log. It needs root: debootstrap, loop devices and mounts.
func Build(ctx context.Context, log io.Writer) (string, error) {
	if os.Geteuid() != 0 {
		return "", errors.New("building the vm image needs root (debootstrap, loop devices, mounts)")
	}
	cmd := exec.CommandContext(ctx, "bash", "-s")
	cmd.Stdin = bytes.NewReader(script)
	cmd.Stderr = log
	var out bytes.Buffer
	cmd.Stdout = &out
	// Cancelled (Ctrl-C): SIGTERM to the recipe's process group, whose trap unmounts the chroot's
	// bind mounts and frees the loop device; SIGKILL would leave them on the host.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 2 * time.Minute
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build the vm image: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	path := lines[len(lines)-1]
	if _, err := vmdisk.Inspect(path, vmdisk.QCOW2); err != nil {
		return "", fmt.Errorf("build the vm image: %s: %w", path, err)
	}
	return path, nil
}

// Detect returns the format of the disk image at path: qcow2 by its magic, else raw.
func Detect(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var magic [4]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	if string(magic[:]) == "QFI\xfb" {
		return vmdisk.QCOW2, nil
	}
	return vmdisk.Raw, nil
}

// Tar returns a tar stream of the layer that holds the disk image at path (format qcow2 or raw):
// one file, disk.qcow2 or disk.raw, as a vm-image layer wants. The image is checked first.
func Tar(path, format string) (io.ReadCloser, int64, error) {
	if _, err := vmdisk.Inspect(path, format); err != nil {
		return nil, 0, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	name := vmdisk.FileName(format)
	pr, pw := io.Pipe()
	go func() {
		defer f.Close()
		tw := tar.NewWriter(pw)
		err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: fi.Size(), ModTime: fi.ModTime(), Typeflag: tar.TypeReg, Format: tar.FormatPAX})
		if err == nil {
			_, err = io.Copy(tw, f)
		}
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr, fi.Size(), nil
}
