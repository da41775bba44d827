package guestimage

import (
	"bytes"
	"debug/elf"

	"github.com/corral-dev/corral/internal/errdefs"
)

// checkStaticELF reports whether data is an executable the guest kernel can run as /init with
// nothing else in the initramfs: a 64-bit x86-64 ELF executable without a program interpreter.
// A dynamically linked binary would need ld.so and libc, which the initramfs does not carry.
func checkStaticELF(name string, data []byte) error {
	if !bytes.HasPrefix(data, []byte(elf.ELFMAG)) {
		return errdefs.Invalid("agent", "%s is not an ELF executable; build corral-agent for linux/amd64 (CGO_ENABLED=0 go build ./cmd/corral-agent)", name)
	}
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return errdefs.Invalid("agent", "%s is a malformed ELF file: %v", name, err)
	}
	if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_X86_64 {
		return errdefs.Invalid("agent", "%s is built for %v %v; the guest needs x86-64 (GOARCH=amd64)", name, f.Class, f.Machine)
	}
	// ET_DYN without an interpreter is a static PIE, which the kernel runs as it is.
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return errdefs.Invalid("agent", "%s is an ELF %v, not an executable", name, f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			interp := ""
			if p.Filesz < 4096 {
				b := make([]byte, p.Filesz)
				if _, err := p.ReadAt(b, 0); err == nil {
					interp = " (interpreter " + string(bytes.TrimRight(b, "\x00")) + ")"
				}
			}
			return errdefs.Invalid("agent", "%s is dynamically linked%s and cannot run as the guest's /init; build it static (CGO_ENABLED=0 go build ./cmd/corral-agent)", name, interp)
		}
	}
	return nil
}
