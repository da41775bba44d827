// Command mmapsum checks files through mmap: for each "sha256-hex  path" line of the file named
// by its argument, it maps path, hashes the mapping and compares. It exits 0 when every file
// matches, 1 naming the first that does not, and dies with SIGBUS when a page of a mapping
// cannot be read (what a lazily fetched layer must never do). TestFaultLazydKill runs it inside
// sandboxes, from the layer under test (so exec-ing it is an mmap read too).
package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"syscall"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: mmapsum SUMS")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		want, path, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			continue
		}
		if got, err := sum(path); err != nil || got != want {
			fmt.Printf("%s: got %s (%v), want %s\n", path, got, err, want)
			os.Exit(1)
		}
	}
}

func sum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return "", err
	}
	m, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return "", err
	}
	defer syscall.Munmap(m)
	h := sha256.Sum256(m) // a page the kernel cannot read is SIGBUS here
	return hex.EncodeToString(h[:]), nil
}
