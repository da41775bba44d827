package mountinfo

import (
	"testing"

	"github.com/corral-dev/corral/internal/doccheck"
)

func TestDocComments(t *testing.T) { doccheck.Exported(t, ".") }

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/x\134y`: `/x\y`, "/plain": "/plain", `/bad\9`: `/bad\9`} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestUnder(t *testing.T) {
	mps, err := Under("/proc")
	if err != nil || len(mps) == 0 || mps[len(mps)-1] != "/proc" {
		t.Fatalf("Under(/proc) = %v, %v: want /proc last (deepest first)", mps, err)
	}
	if !IsMountpoint("/proc") || IsMountpoint("/proc/self") {
		t.Fatal("IsMountpoint")
	}
}
