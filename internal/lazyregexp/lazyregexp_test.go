package lazyregexp

import (
	"sync"
	"testing"
)

func TestLazy(t *testing.T) {
	r := New(`^a([0-9]{1,3})$`)
	if r.rx != nil {
		t.Fatal("compiled before first use")
	}
	if got := r.String(); got != `^a([0-9]{1,3})$` {
		t.Errorf("String() = %q", got)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if !r.MatchString("a12") || r.MatchString("a1234") {
				t.Error("MatchString wrong")
			}
		})
	}
	wg.Wait()
	if got := r.FindStringSubmatch("a42"); len(got) != 2 || got[1] != "42" {
		t.Errorf("FindStringSubmatch = %q", got)
	}
}

func TestBadPatternPanicsOnUse(t *testing.T) {
	r := New(`(`)
	defer func() {
		if recover() == nil {
			t.Error("no panic on a bad pattern")
		}
	}()
	r.MatchString("x")
}
