package vmguest

import (
	"context"
	"fmt"
	"net"
	"os"
	goruntime "runtime"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/errdefs"
)

// forkCaps are what ApplyForkIdentity needs beyond the commands' set: CAP_NET_ADMIN (the
// interface's address and route), CAP_SYS_ADMIN (the hostname, the entropy pool) and
// CAP_SYS_TIME (the clock). PID 1 keeps them in its permitted set alone (dropCaps): no thread
// has them in effect but the one ApplyForkIdentity raises them on, which ends afterwards, and,
// out of the bounding set, no command can ever have them.
const forkCaps = 1<<unix.CAP_NET_ADMIN | 1<<unix.CAP_SYS_ADMIN | 1<<unix.CAP_SYS_TIME

// ApplyForkIdentity is a microvm agent's agentrpc.Config.ForkIdentity: it gives the guest of a
// fork's copy, restored from its source's memory, its own clock, entropy, hostname, address,
// route and resolv.conf (see agentrpc.ForkIdentity). It runs on a thread of its own that raises
// forkCaps and is then thrown away (its goroutine ends locked to it).
func ApplyForkIdentity(ctx context.Context, id agentrpc.ForkIdentity) error {
	return withCaps(ctx, forkCaps, func() error { return applyForkIdentity(id) })
}

// withCaps runs fn on a thread of its own with caps (which must be in PID 1's permitted set:
// forkCaps) raised in its effective set, lowered again after; the thread is thrown away
// afterwards (its goroutine ends locked to it), so no other goroutine ever runs with them. (Go
// cannot end the process's main thread: it parks it instead, which is why they are lowered.)
func withCaps(ctx context.Context, caps uint64, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := setEffective(caps, true); err != nil {
			errc <- err
			return
		}
		err := fn()
		if lerr := setEffective(caps, false); lerr != nil && err == nil {
			err = lerr
		}
		errc <- err
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func applyForkIdentity(id agentrpc.ForkIdentity) error {
	if id.Now > 0 {
		ts := unix.NsecToTimespec(id.Now)
		if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
			return fmt.Errorf("set the clock: %w", err)
		}
	}
	if len(id.Seed) > 0 {
		if err := addEntropy(id.Seed); err != nil {
			return fmt.Errorf("seed the entropy pool: %w", err)
		}
		if err := reseed(); err != nil {
			return fmt.Errorf("reseed the kernel's random generator: %w", err)
		}
	}
	if err := unix.Sethostname([]byte(id.Hostname)); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	if id.MAC != "" {
		if err := readdress(id); err != nil {
			return err
		}
	}
	if id.ResolvConf != "" {
		if err := writeEtcFile("/etc/resolv.conf", id.ResolvConf); err != nil {
			return err
		}
	}
	return nil
}

// setEffective adds caps, which must be in the permitted set, to this thread's effective set
// (raise), or takes them out of it.
func setEffective(caps uint64, raise bool) error {
	hdr := &unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := &[2]unix.CapUserData{}
	if err := unix.Capget(hdr, &data[0]); err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	if raise {
		data[0].Effective |= uint32(caps)
		data[1].Effective |= uint32(caps >> 32)
	} else {
		data[0].Effective &^= uint32(caps)
		data[1].Effective &^= uint32(caps >> 32)
	}
	if err := unix.Capset(hdr, &data[0]); err != nil {
		return fmt.Errorf("set effective capabilities %#x (raise %v): %w", caps, raise, err)
	}
	return nil
}

// reseed makes the kernel's random generator reseed from its pool now (RNDRESEEDCRNG), so that
// what was just added takes effect at once rather than at the next scheduled reseed.
func reseed() error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDRESEEDCRNG, 0); errno != 0 {
		return errno
	}
	return nil
}

// readdress moves the interface with id.MAC from its source's address to id.Address: the new
// address first, then every other IPv4 address off it (which takes their routes along), then the
// default route via id.Gateway.
func readdress(id agentrpc.ForkIdentity) error {
	mac, err := net.ParseMAC(id.MAC)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	link, err := waitLink(mac, time.Second)
	if err != nil {
		return err
	}
	name := link.Attrs().Name
	addr, err := netlink.ParseAddr(id.Address)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	if err := netlink.AddrReplace(link, addr); err != nil {
		return fmt.Errorf("network: add %s to %s: %w", id.Address, name, err)
	}
	old, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("network: list the addresses of %s: %w", name, err)
	}
	for _, a := range old {
		if a.IPNet.String() == addr.IPNet.String() {
			continue
		}
		if err := netlink.AddrDel(link, &a); err != nil {
			return fmt.Errorf("network: remove %s from %s: %w", a.IPNet, name, err)
		}
	}
	gw := net.ParseIP(id.Gateway)
	if err := netlink.RouteReplace(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: gw}); err != nil {
		return fmt.Errorf("network: default route via %s: %w", id.Gateway, err)
	}
	// Neighbours learnt under the source's address (its gateway's MAC) are of another network.
	neighs, _ := netlink.NeighList(link.Attrs().Index, netlink.FAMILY_V4)
	for _, n := range neighs {
		netlink.NeighDel(&n)
	}
	return nil
}

// claim is the state of ClaimHostname.
var claim struct {
	sync.Mutex
	done bool
}

// ClaimHostname sets the hostname of a claimable VM's sandbox at its claim
// (agentrpc.Config.SetHostname), with CAP_SYS_ADMIN raised on a thread of its own as
// ApplyForkIdentity raises it (withCaps). It serves once: a second call is a conflict.
func ClaimHostname(name string) error {
	claim.Lock()
	defer claim.Unlock()
	if claim.done {
		return errdefs.Conflict("the sandbox's hostname was set at its claim already")
	}
	if !hostnameRE.MatchString(name) {
		return errdefs.Invalid("hostname", "%q is not a valid hostname", name)
	}
	claim.done = true
	return withCaps(context.Background(), 1<<unix.CAP_SYS_ADMIN, func() error {
		if err := unix.Sethostname([]byte(name)); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
		return nil
	})
}
