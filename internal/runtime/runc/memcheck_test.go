package runc

import (
	"context"
	"testing"
)

func TestMemCheckTmp(t *testing.T) {
	e := newTestEnv(t, nil)
	s := e.spec("mem")
	s.DiskBytes = 512 << 20
	s.MemoryBytes = 1 << 30
	sb := e.create(s)
	st, _ := e.r.Status(context.Background(), s.ID)
	t.Logf("before: %d MiB", st.MemoryBytes>>20)
	okSh(t, sb.AgentSocket, "dd if=/dev/zero of=/f bs=1M count=200; sync")
	st, _ = e.r.Status(context.Background(), s.ID)
	t.Logf("after writing 200 MiB: %d MiB", st.MemoryBytes>>20)
	t.Log(readTrim(t, e.r.cg.dir("memory", s.ID)+"/memory.stat"))
}
