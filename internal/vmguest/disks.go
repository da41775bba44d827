package vmguest

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/inroot"
)

// pollInterval is how often the guest looks again for something that is still probing (a disk,
// the port, the network interface, the fw_cfg file). There is no udev to wait on.
const pollInterval = 10 * time.Millisecond

// findDisks waits until every serial names a virtio-blk disk under sysBlock (/sys/block) and
// returns the device node of each, e.g. "l0" -> "/dev/vda". Disks probe asynchronously once
// virtio_blk is loaded; after timeout it fails naming the serials still missing.
func findDisks(sysBlock string, serials []string, timeout time.Duration) (map[string]string, error) {
	deadline := time.Now().Add(timeout)
	for {
		found, err := scanDisks(sysBlock)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		var missing []string
		for _, s := range serials {
			if found[s] == "" {
				missing = append(missing, s)
			}
		}
		if len(missing) == 0 {
			out := make(map[string]string, len(serials))
			for _, s := range serials {
				out[s] = "/dev/" + found[s]
			}
			return out, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("find disks: no virtio-blk disk with serial %s after %v (found %v)",
				strings.Join(missing, ", "), timeout, found)
		}
		time.Sleep(pollInterval)
	}
}

// scanDisks maps the serial of every vd* disk under sysBlock to its name ("vda").
func scanDisks(sysBlock string) (map[string]string, error) {
	ents, err := os.ReadDir(sysBlock)
	if err != nil {
		return nil, fmt.Errorf("find disks: %w", err)
	}
	found := map[string]string{}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "vd") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(sysBlock, e.Name(), "serial"))
		if err != nil {
			continue // not probed yet
		}
		if s := strings.TrimRight(string(b), "\n\x00 "); s != "" {
			found[s] = e.Name()
		}
	}
	return found, nil
}

// mountPageSize is what mount(2) copies of its data argument.
const mountPageSize = 4096

// layerDir is where layer i is mounted under dir.
func layerDir(dir string, i int) string { return filepath.Join(dir, strconv.Itoa(i)) }

// erofsData is the mount data of an EROFS image with extra devices (in order).
func erofsData(devices []string) string {
	opts := make([]string, len(devices))
	for i, d := range devices {
		opts[i] = "device=" + d
	}
	return strings.Join(opts, ",")
}

// overlayData is the overlay's mount data for layer directories given bottom first (overlay
// wants the top one first), or an error when it does not fit in mount(2)'s one page.
func overlayData(lower []string, upper, work string) (string, error) {
	top := make([]string, len(lower))
	for i, l := range lower {
		if strings.ContainsAny(l, ":,") {
			return "", fmt.Errorf("overlay: layer directory %q holds ':' or ','", l)
		}
		top[len(lower)-1-i] = l
	}
	data := "lowerdir=" + strings.Join(top, ":") + ",upperdir=" + upper + ",workdir=" + work
	if len(data) >= mountPageSize {
		return "", fmt.Errorf("overlay: %d layers make %d bytes of mount options, more than the %d one mount takes: collapse layers",
			len(lower), len(data), mountPageSize-1)
	}
	return data, nil
}

// mountRoot mounts the sandbox's root at newroot: each layer's EROFS image read-only under
// dir/l/<i>, the writable disk at dir/upper, and the overlay of them all.
func mountRoot(c *Config, disks map[string]string, dir, newroot string) error {
	var lower []string
	for i, l := range c.Layers {
		target := layerDir(filepath.Join(dir, "l"), i)
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
		devs := make([]string, len(l.Devices))
		for j, d := range l.Devices {
			devs[j] = disks[d]
		}
		if err := unix.Mount(disks[l.Serial], target, "erofs", unix.MS_RDONLY, erofsData(devs)); err != nil {
			return fmt.Errorf("mount layer %s (%s): %w", l.Serial, disks[l.Serial], err)
		}
		lower = append(lower, target)
	}
	upper := filepath.Join(dir, "upper")
	if err := os.MkdirAll(upper, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(disks[c.UpperSerial], upper, "ext4", 0, ""); err != nil {
		return fmt.Errorf("mount writable disk %s (%s): %w", c.UpperSerial, disks[c.UpperSerial], err)
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.MkdirAll(filepath.Join(upper, d), 0o755); err != nil {
			return fmt.Errorf("writable disk: %w", err)
		}
	}
	data, err := overlayData(lower, filepath.Join(upper, "upper"), filepath.Join(upper, "work"))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(newroot, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("overlay", newroot, "overlay", 0, data); err != nil {
		return fmt.Errorf("mount overlay root: %w", err)
	}
	// Under newroot, so they move with it to /. Nothing of the sandbox runs yet.
	for _, v := range c.Volumes {
		if err := inroot.Mkdir(newroot, v.Path, false); err != nil {
			return fmt.Errorf("volume at %s: %w", v.Path, err)
		}
		flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOATIME)
		data := ""
		if v.ReadOnly {
			flags |= unix.MS_RDONLY
			data = "noload" // no journal replay: nothing written to a shared read-only disk
		}
		if err := unix.Mount(disks[v.Serial], filepath.Join(newroot, v.Path), "ext4", flags, data); err != nil {
			return fmt.Errorf("mount volume %s (%s) at %s: %w", v.Serial, disks[v.Serial], v.Path, err)
		}
	}
	if c.Workdir != "" {
		if err := inroot.Mkdir(newroot, path.Clean(c.Workdir), true); err != nil {
			return fmt.Errorf("working directory %s: %w", c.Workdir, err)
		}
	}
	return nil
}
