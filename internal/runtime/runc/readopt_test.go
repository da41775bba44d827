package runc

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/runtime"
)

const helperEnv = "CORRAL_RUNC_TEST_HELPER"

// helperMain is the test binary re-run as a stand-in for the edge: it creates one sandbox,
// prints it as JSON and waits to be killed.
func helperMain() {
	var in struct {
		Config Config
		Spec   Spec
	}
	if err := json.Unmarshal([]byte(os.Getenv(helperEnv)), &in); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	r, err := New(context.Background(), in.Config, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	sb, err := r.Create(context.Background(), runtime.Spec(in.Spec))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	json.NewEncoder(os.Stdout).Encode(sb)
	select {}
}

// lineWriter records output and signals the first newline.
type lineWriter struct {
	mu   sync.Mutex
	buf  strings.Builder
	line chan struct{}
	once sync.Once
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), "\n") {
		w.once.Do(func() { close(w.line) })
	}
	return len(p), nil
}

// TestSurvivesCallerKill9 creates a sandbox from a separate process, kill -9s that process and
// checks the sandbox kept running, held no pipe to it, and is re-adopted by a new Runtime.
func TestSurvivesCallerKill9(t *testing.T) {
	e := newTestEnv(t, nil)
	e.r.Close() // the helper process plays this Runtime until it is killed
	e.r = nil
	spec := e.spec("survivor")
	in, _ := json.Marshal(map[string]any{"Config": e.cfg, "Spec": spec})

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+string(in))
	out := &lineWriter{line: make(chan struct{})}
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = out, &stderr // pipes: a container holding one would block Wait
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case <-out.line:
	case err := <-exited:
		t.Fatalf("helper exited: %v: %s", err, stderr.String())
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatal("helper did not create the sandbox in time")
	}
	var sb runtime.Sandbox
	if err := json.Unmarshal([]byte(out.buf.String()), &sb); err != nil {
		t.Fatal(err)
	}
	if st := procStat(t, sb.Pid); st.ppid == cmd.Process.Pid || st.sid == cmd.Process.Pid || st.pgrp == cmd.Process.Pid {
		t.Errorf("init %d is tied to its creator %d: %+v", sb.Pid, cmd.Process.Pid, st)
	}
	cmd.Process.Kill()
	select {
	case <-exited: // every pipe to the helper reached EOF: the sandbox holds none
	case <-time.After(10 * time.Second):
		t.Fatal("helper's pipes stay open after kill -9: the sandbox holds one")
	}

	e.r = e.open() // the restarted edge
	ctx := context.Background()
	ids, err := e.r.List(ctx)
	if err != nil || len(ids) != 1 || ids[0] != spec.ID {
		t.Fatalf("List = %v %v, want [%s]", ids, err, spec.ID)
	}
	got, err := e.r.Open(ctx, spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Pid != sb.Pid || got.AgentSocket != sb.AgentSocket || got.Dir != sb.Dir {
		t.Errorf("Open = %+v, want %+v", got, sb)
	}
	if out := okSh(t, got.AgentSocket, "echo alive"); out != "alive" {
		t.Errorf("agent after the caller's death: %q", out)
	}
	st, err := e.r.Status(ctx, spec.ID)
	if err != nil || st.State != runtime.StateRunning || st.Pid != sb.Pid {
		t.Errorf("Status = %+v %v, want running", st, err)
	}
}
