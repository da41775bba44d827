//go:build !linux || !(amd64 || arm64)

package seccompbpf

import specs "github.com/opencontainers/runtime-spec/specs-go"

// No system call table here: Compile answers ErrUnsupported.
const (
	nativeAudit = 0
	nativeArch  = specs.Arch("")
	hasX32      = false
)

var syscalls map[string]uint32
