package qemu

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/nsutil"
)

// The VM's network: the sandbox's network namespace (internal/egress) has a veth "eth0" whose
// peer is on the host, where the egress policy filters it. For a VM, eth0 and a tap are joined
// by a bridge inside that namespace, and the sandbox's address moves from eth0 to the guest's
// interface, so the guest's packets leave through the same veth with the same source address:
// the policy applies unchanged. Nothing of it is in the host's namespace, and the namespace is
// destroyed with the slot when the sandbox ends.
const (
	bridgeName = "br0"
	tapName    = "tap0"
)

// openTap prepares the bridge (idempotent) and creates the tap in the namespace at path,
// returning its descriptor for QEMU. The tap is not persistent: it goes away with the last
// descriptor, that is with the QEMU process.
func openTap(path string) (*os.File, error) {
	var tap *os.File
	err := nsutil.InNetns(path, func() error {
		h, err := netlink.NewHandle()
		if err != nil {
			return err
		}
		defer h.Close()
		br, err := h.LinkByName(bridgeName)
		if err != nil {
			if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridgeName}}); err != nil {
				return fmt.Errorf("add bridge: %w", err)
			}
			if br, err = h.LinkByName(bridgeName); err != nil {
				return err
			}
		}
		eth, err := h.LinkByName("eth0")
		if err != nil {
			return fmt.Errorf("the namespace has no eth0: %w", err)
		}
		if eth.Attrs().MasterIndex != br.Attrs().Index {
			addrs, err := h.AddrList(eth, unix.AF_INET)
			if err != nil {
				return err
			}
			for _, a := range addrs {
				if err := h.AddrDel(eth, &a); err != nil {
					return fmt.Errorf("move the address off eth0: %w", err)
				}
			}
			if err := h.LinkSetMaster(eth, br); err != nil {
				return fmt.Errorf("join eth0 to the bridge: %w", err)
			}
		}
		if err := h.LinkSetUp(br); err != nil {
			return err
		}
		if err := h.LinkSetUp(eth); err != nil {
			return err
		}
		f, err := newTap()
		if err != nil {
			return err
		}
		t, err := h.LinkByName(tapName)
		if err == nil {
			err = h.LinkSetMaster(t, br)
		}
		if err == nil {
			err = h.LinkSetUp(t)
		}
		if err != nil {
			f.Close()
			return fmt.Errorf("attach tap: %w", err)
		}
		tap = f
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	return tap, nil
}

// newTap creates the tap in the calling thread's network namespace.
func newTap() (*os.File, error) {
	f, err := os.OpenFile("/dev/net/tun", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	var req [unix.IFNAMSIZ + 64]byte
	copy(req[:], tapName)
	*(*uint16)(unsafe.Pointer(&req[unix.IFNAMSIZ])) = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req[0]))); errno != 0 {
		f.Close()
		if errors.Is(errno, unix.EBUSY) {
			return nil, fmt.Errorf("tap %s is still in use (a QEMU process of this sandbox is still running?): %w", tapName, errno)
		}
		return nil, fmt.Errorf("create tap: %w", errno)
	}
	return f, nil
}

// openPrivateTap creates a tap alone in a new, unnamed network namespace, for a template VM:
// its card must have a backend of the same kind as its sandboxes' (QEMU derives the card's
// features from it), but nothing may reach it. The namespace lives as long as the tap, which
// lives as long as QEMU holds it. The thread that made the namespace ends with it.
func openPrivateTap() (*os.File, error) {
	type result struct {
		f   *os.File
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in the new namespace
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("network: new namespace: %w", err)}
			return
		}
		f, err := newTap()
		ch <- result{f, err}
	}()
	r := <-ch
	return r.f, r.err
}
