package internal
import (
 _ "golang.org/x/sys/unix"
 _ "github.com/creack/pty"
 _ "github.com/opencontainers/runtime-spec/specs-go"
 _ "github.com/moby/profiles/seccomp"
 _ "modernc.org/sqlite"
 _ "github.com/spf13/cobra"
 _ "github.com/klauspost/compress/zstd"
)

