// Package cleanup provides Stack: the undo steps of an operation that acquires resources one
// after another, run newest first when the operation fails and forgotten when it succeeds.
//
// A sandbox's create is the model (internal/edge launch, internal/runtime/runc Create): it
// writes a record, mounts layers, claims a disk, a network slot and a user-namespace slot, and
// starts a runtime sandbox, and any step may fail. Instead of every failure branch repeating
// the undo of all the steps before it, each step pushes its own undo the moment it holds the
// resource (never before: the stack says exactly what to give back), and a failure unwinds:
//
//	var undo cleanup.Stack
//	defer undo.Unwind() // gives back what is still held when the function fails
//	d, err := takeDisk()
//	if err != nil {
//		return err // nothing pushed yet: nothing to give back
//	}
//	undo.Push(func() { giveBack(d) })
//	if err := mount(d); err != nil {
//		return err // the deferred Unwind gives d back
//	}
//	undo.Release() // success: what was acquired now belongs to the result
//	return nil
//
// A step that needs the failure's cause (a record that ends "failed" with a reason) reads it
// from a variable the caller sets before it unwinds. Steps run on the goroutine that calls
// Unwind and must not fail the unwinding: each logs or joins its own error.
package cleanup

// Stack holds undo steps, newest on top. Its zero value is an empty stack ready for use. A
// Stack belongs to one goroutine (the operation's); it is not safe for concurrent use.
type Stack struct {
	steps []func()
}

// Push adds step on top: it will run before every step pushed earlier.
func (s *Stack) Push(step func()) {
	if s.steps == nil {
		s.steps = make([]func(), 0, 8) // a create's steps: one allocation, not four
	}
	s.steps = append(s.steps, step)
}

// Unwind runs the steps newest first and leaves the stack empty, so that an Unwind after
// another (a deferred one after an explicit one) or after Release runs nothing. A step is
// taken off the stack before it runs: one that panics is not run again by a later Unwind.
func (s *Stack) Unwind() {
	for n := len(s.steps); n > 0; n = len(s.steps) {
		step := s.steps[n-1]
		s.steps[n-1] = nil
		s.steps = s.steps[:n-1]
		step()
	}
}

// Release forgets every step without running it: the operation succeeded and what it
// acquired is now owned by its result.
func (s *Stack) Release() {
	clear(s.steps)
	s.steps = s.steps[:0]
}

// Len is the number of steps waiting.
func (s *Stack) Len() int { return len(s.steps) }
