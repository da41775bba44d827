package cleanup

import (
	"errors"
	"slices"
	"testing"

	"github.com/corral-dev/corral/internal/doccheck"
)

func TestDocComments(t *testing.T) { doccheck.Exported(t, ".") }

// record returns a step that appends name to *ran.
func record(ran *[]string, name string) func() {
	return func() { *ran = append(*ran, name) }
}

func TestUnwindRunsNewestFirst(t *testing.T) {
	var ran []string
	var s Stack
	for _, n := range []string{"record", "layers", "network", "runtime"} {
		s.Push(record(&ran, n))
	}
	if s.Len() != 4 {
		t.Fatalf("Len = %d, want 4", s.Len())
	}
	s.Unwind()
	if want := []string{"runtime", "network", "layers", "record"}; !slices.Equal(ran, want) {
		t.Fatalf("ran %v, want %v", ran, want)
	}
	if s.Len() != 0 {
		t.Fatalf("Len after Unwind = %d, want 0", s.Len())
	}
	s.Unwind()
	if len(ran) != 4 {
		t.Fatalf("a second Unwind ran steps again: %v", ran)
	}
}

func TestReleaseRunsNothing(t *testing.T) {
	var ran []string
	func() {
		var s Stack
		defer s.Unwind()
		s.Push(record(&ran, "disk"))
		s.Push(record(&ran, "mount"))
		s.Release()
	}()
	if len(ran) != 0 {
		t.Fatalf("released steps ran: %v", ran)
	}
	// A stack reused after Release holds only what was pushed since.
	var s Stack
	s.Push(record(&ran, "old"))
	s.Release()
	s.Push(record(&ran, "new"))
	s.Unwind()
	if want := []string{"new"}; !slices.Equal(ran, want) {
		t.Fatalf("ran %v, want %v", ran, want)
	}
}

// A deferred Unwind gives back exactly what was acquired before the failure, and the steps see
// the failure's cause through the caller's variable.
func TestDeferredUnwindOnFailure(t *testing.T) {
	var ran []string
	acquire := func(failAt int) (err error) {
		var s Stack
		defer s.Unwind()
		var cause string
		s.Push(func() { ran = append(ran, "record failed: "+cause) })
		for i, n := range []string{"layers", "network", "runtime"} {
			if i == failAt {
				cause = n + " refused"
				return errFailed
			}
			s.Push(record(&ran, n))
		}
		s.Release()
		return nil
	}
	tests := []struct {
		failAt int
		want   []string
	}{
		{0, []string{"record failed: layers refused"}},
		{2, []string{"network", "layers", "record failed: runtime refused"}},
		{3, nil},
	}
	for _, tt := range tests {
		ran = nil
		err := acquire(tt.failAt)
		if (err != nil) != (tt.want != nil) || !slices.Equal(ran, tt.want) {
			t.Errorf("fail at %d: err %v, ran %v; want %v", tt.failAt, err, ran, tt.want)
		}
	}
}

// A step that panics is off the stack: recovering and unwinding again runs the rest, once.
func TestPanickingStepRunsOnce(t *testing.T) {
	var ran []string
	var s Stack
	s.Push(record(&ran, "a"))
	s.Push(func() { ran = append(ran, "boom"); panic("boom") })
	func() {
		defer func() { recover() }()
		s.Unwind()
	}()
	s.Unwind()
	if want := []string{"boom", "a"}; !slices.Equal(ran, want) {
		t.Fatalf("ran %v, want %v", ran, want)
	}
}

var errFailed = errors.New("failed")
