//go:build unix

package cli

import (
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/term"
)

// watchResize calls resize with the terminal's size whenever it changes (SIGWINCH) until the
// returned stop is called; stop waits for a call in progress to finish.
func watchResize(fd int, resize func(rows, cols uint16)) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-ch:
				if w, h, err := term.GetSize(fd); err == nil && w > 0 && h > 0 {
					resize(uint16(h), uint16(w))
				}
			case <-done:
				return
			}
		}
	})
	return func() {
		signal.Stop(ch)
		close(done)
		wg.Wait()
	}
}
