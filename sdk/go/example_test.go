package corral_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
	"github.com/corral-dev/corral/sdk/go/corraltest"
)

// This example creates a sandbox, runs a command in it and deletes it, against a real server.
func Example() {
	ctx := context.Background()
	c := corral.New(os.Getenv("CORRAL_URL"), os.Getenv("CORRAL_TOKEN"))

	sb, err := c.CreateSandbox(ctx, corral.CreateRequest{
		Base:   "base:default",
		Limits: corral.Limits{CPUs: 1, MemoryBytes: 512 << 20},
		TTL:    "30m",
		Labels: map[string]string{"task": "example"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)

	stdout, stderr, exit, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"uname", "-a"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("exit %d\nstdout: %s\nstderr: %s\n", exit.Code, stdout, stderr)
}

// Run collects a command's output; a non-zero exit is reported in Exit, not as an error. This
// example runs against the in-memory fake server of package corraltest.
func ExampleClient_Run() {
	srv := corraltest.Start()
	defer srv.Close()
	c := srv.Client()
	ctx := context.Background()

	sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: corraltest.DefaultBase})
	if err != nil {
		log.Fatal(err)
	}
	stdout, _, exit, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"echo", "hello"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%q exit=%d\n", stdout, exit.Code)

	_, _, exit, err = c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"exit", "3"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("exit=%d\n", exit.Code)
	// Output:
	// "hello\n" exit=0
	// exit=3
}

// ExecStream feeds stdin while output streams back, in one request.
func ExampleClient_ExecStream() {
	srv := corraltest.Start()
	defer srv.Close()
	c := srv.Client()
	ctx := context.Background()

	sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: corraltest.DefaultBase})
	if err != nil {
		log.Fatal(err)
	}
	s, err := c.ExecStream(ctx, sb.ID, corral.ExecRequest{Argv: []string{"cat"}}, strings.NewReader("piped in\n"))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	exit, err := s.Copy(os.Stdout, os.Stderr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit", exit.Code)
	// Output:
	// piped in
	// exit 0
}

// A background command outlives the request that started it; Attach reads its output later,
// from any offset.
func ExampleClient_Attach() {
	ctx := context.Background()
	c := corral.New("http://127.0.0.1:7070", os.Getenv("CORRAL_TOKEN"))

	cmd, err := c.StartCommand(ctx, "sb-1", corral.ExecRequest{Argv: []string{"make", "test"}, Timeout: "10m"})
	if err != nil {
		log.Fatal(err)
	}
	s, err := c.Attach(ctx, "sb-1", cmd.ID, 0, true)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	for {
		ev, err := s.Next()
		if err != nil {
			break // io.EOF after the exit event
		}
		switch ev.Type {
		case corral.EventStdout, corral.EventStderr:
			fmt.Printf("%s @%d: %s", ev.Type, ev.Offset, ev.Data)
		case corral.EventExit:
			fmt.Println("exit", ev.Exit.Code)
		}
	}
}

// Classify failures with the Is helpers; the *APIError carries the server's message and the
// request field at fault.
func ExampleIsNotFound() {
	srv := corraltest.Start()
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	_, err := srv.Client().GetSandbox(ctx, "sb-404")
	fmt.Println(corral.IsNotFound(err), err)
	// Output:
	// true sandbox sb-404 not found
}

// Compile in one fncall environment, run the binary in another: the build keeps its product on
// the node (Keep) and the run takes it by reference (FileRefs), so the binary never passes
// through the client. Against a real server with environments "gcc" (a base with gcc) and
// "runner".
func ExampleClient_Call() {
	ctx := context.Background()
	c := corral.New(os.Getenv("CORRAL_URL"), os.Getenv("CORRAL_TOKEN"))

	build, err := c.Call(ctx, "gcc", corral.CallRequest{
		Files: map[string][]byte{"main.c": []byte(`#include <stdio.h>
int main(int argc, char **argv) { printf("hello %s\n", argc > 1 ? argv[1] : "world"); return 0; }`)},
		Argv: []string{"gcc", "-O2", "-static", "-o", "prog", "main.c"},
		Keep: []string{"prog"},
	})
	if err != nil {
		log.Fatal(err)
	}
	if build.Exit.Code != 0 {
		log.Fatalf("compile failed: %s", build.Stderr)
	}
	run, err := c.Call(ctx, "runner", corral.CallRequest{
		FileRefs: map[string]string{"prog": build.Artifacts["prog"]},
		Argv:     []string{"./prog", "corral"},
		Timeout:  "2s",
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("exit %d: %s", run.Exit.Code, run.Stdout)
}
