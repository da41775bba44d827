//go:build !unix

package cli

// watchResize does nothing where there is no SIGWINCH; the terminal keeps its initial size.
func watchResize(fd int, resize func(rows, cols uint16)) (stop func()) { return func() {} }
