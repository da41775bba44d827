package cgroups

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestReadFile: readFile returns what os.ReadFile does, for small files and for ones past its
// first buffer, and a missing file's error is fs.ErrNotExist.
func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	for _, size := range []int{0, 7, 512, 513, 5000} {
		p := filepath.Join(dir, "f")
		want := bytes.Repeat([]byte("0123456789\n"), size/11+1)[:size]
		if err := os.WriteFile(p, want, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := readFile(p)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("readFile of %d bytes: %d bytes, %v", size, len(got), err)
		}
	}
	// A pseudo-file whose size stat does not know.
	want, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := readFile("/proc/self/mountinfo"); err != nil || len(got) == 0 || bytes.Count(got, []byte("\n")) < bytes.Count(want, []byte("\n"))/2 {
		t.Errorf("readFile(/proc/self/mountinfo): %d bytes, %v (os.ReadFile: %d)", len(got), err, len(want))
	}
	if _, err := readFile(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v, want not exist", err)
	}
}
