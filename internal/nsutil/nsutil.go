// Package nsutil runs code inside another network namespace.
package nsutil

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// InNetns runs f on an OS thread of its own that has entered the network namespace at path;
// sockets f opens stay in that namespace. The thread is never given back to Go's scheduler (it
// ends with f), so no other goroutine ever runs in the namespace by accident.
func InNetns(path string, f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		done <- func() error {
			ns, err := netns.GetFromPath(path)
			if err != nil {
				return fmt.Errorf("open network namespace %s: %w", path, err)
			}
			defer ns.Close()
			if err := netns.Set(ns); err != nil {
				return fmt.Errorf("enter network namespace %s: %w", path, err)
			}
			return f()
		}()
	}()
	return <-done
}
