package vmlink

import (
	"errors"
	"io"
	"net"
	"sync"
)

// Hold plays, for a gVisor sandbox, the part QEMU's chardev server plays for a microVM: it holds
// the host's end of the agent's one byte stream (fromGuest, what the agent writes; toGuest, what
// it reads: a pair of pipes whose other ends are the sandbox's stdin and stdout) and serves it
// on ln, one client at a time. A client's bytes go to the agent; the agent's bytes go to the
// current client, or are discarded while none is connected (so the agent never blocks on a
// host that went away). A client that connects while another is connected waits until that one
// leaves, as QEMU's second client does. The vmlink handshake on every new client resynchronizes
// the stream, so a Proxy reaches the agent through Hold exactly as through QEMU.
//
// Hold returns when the agent's end is closed (fromGuest reads EOF: the sandbox exited or was
// checkpointed) or fails; it then closes ln and the current client. Goroutines: the caller's
// accepts; one reads fromGuest; one per client copies it to toGuest, ending with the client.
func Hold(ln net.Listener, fromGuest io.Reader, toGuest io.Writer) error {
	h := &holder{}
	done := make(chan error, 1)
	go func() { done <- h.pump(fromGuest) }()
	accepted := make(chan net.Conn)
	acceptErr := make(chan error, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				acceptErr <- err
				return
			}
			accepted <- c
		}
	}()
	var left chan struct{} // closed when the current client's copy ends; nil while none
	var waiting []net.Conn // clients accepted while another was connected
	start := func(c net.Conn) {
		l := make(chan struct{})
		left = l
		h.set(c)
		go func() {
			io.Copy(toGuest, c) // ends with the client, or when the agent's end is gone
			h.clear(c)
			c.Close()
			close(l)
		}()
	}
	defer func() {
		ln.Close()
		if c := h.get(); c != nil {
			c.Close()
		}
		for _, c := range waiting {
			c.Close()
		}
	}()
	for {
		select {
		case err := <-done:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case err := <-acceptErr:
			return err
		case c := <-accepted:
			if left == nil {
				start(c)
			} else {
				waiting = append(waiting, c)
			}
		case <-left:
			left = nil
			if len(waiting) > 0 {
				c := waiting[0]
				waiting = waiting[1:]
				start(c)
			}
		}
	}
}

// holder is Hold's state. Lock order: mu is a leaf.
type holder struct {
	mu sync.Mutex
	// Protected by mu:
	client net.Conn // the connected client, or nil
}

func (h *holder) set(c net.Conn) {
	h.mu.Lock()
	h.client = c
	h.mu.Unlock()
}

func (h *holder) clear(c net.Conn) {
	h.mu.Lock()
	if h.client == c {
		h.client = nil
	}
	h.mu.Unlock()
}

func (h *holder) get() net.Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.client
}

// pump copies what the agent writes to the current client until fromGuest fails (io.EOF when
// the agent's end closed). A write to a client that fails drops that client.
func (h *holder) pump(fromGuest io.Reader) error {
	buf := make([]byte, 64<<10)
	for {
		n, err := fromGuest.Read(buf)
		if n > 0 {
			if c := h.get(); c != nil {
				if _, werr := c.Write(buf[:n]); werr != nil {
					h.clear(c)
					c.Close()
				}
			}
		}
		if err != nil {
			return err
		}
	}
}
