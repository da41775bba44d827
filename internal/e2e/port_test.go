package e2e

import (
	"bufio"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestPortProxy reaches an HTTP server listening on a sandbox's own loopback (a sandbox without
// networking) through the API and through `corral port`, on each runtime (runc through the
// sandbox's network namespace, gVisor and microvm through the agent inside); a port where
// nothing listens and a caller without a token get clear errors.
func TestPortProxy(t *testing.T) {
	forRuntimes(t, testPortProxy)
}

func testPortProxy(t *testing.T, rt string) {
	p := withBaseOn(t, rt)
	sb := p.create(corral.CreateRequest{})
	ctx := t.Context()
	if _, err := p.Client.WriteFile(ctx, sb.ID, "/www/hello.txt", strings.NewReader("hello from inside\n"), corral.WriteFileOptions{Parents: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Client.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"busybox", "httpd", "-f", "-p", "127.0.0.1:8000", "-h", "/www"}}); err != nil {
		t.Fatal(err)
	}
	get := func(url, token string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	base := p.URL + "/v1/sandboxes/" + sb.ID + "/ports/"
	eventually(t, 30*time.Second, "httpd in the sandbox answers through the API", func() bool {
		code, body := get(base+"8000/hello.txt", p.Token)
		return code == 200 && body == "hello from inside\n"
	})
	{
		// "localhost" resolves inside without DNS (the runtime, or the microvm's guest, writes
		// /etc/hosts); root inside may add an entry, as in Docker, and a name it adds resolves.
		out, errOut, exit := p.run(sb.ID, "/bin/sh", "-c", "wget -q -O- http://localhost:8000/hello.txt && "+
			"echo '127.0.0.1 added.example' >> /etc/hosts && wget -q -O- http://added.example:8000/hello.txt")
		if exit == nil || exit.Code != 0 || !strings.HasPrefix(out, "hello from inside\n") || !strings.HasSuffix(out, "hello from inside\n") {
			t.Errorf("localhost inside: %q %q (exit %+v)", out, errOut, exit)
		}
	}
	if code, body := get(base+"8001/hello.txt", p.Token); code != 503 || !strings.Contains(body, "nothing answers on port 8001") {
		t.Errorf("a port where nothing listens: %d %s", code, body)
	}
	if code, _ := get(base+"8000/hello.txt", ""); code != 401 {
		t.Errorf("a port without a token: %d", code)
	}
	if code, body := get(base+"70000/x", p.Token); code != 400 || !strings.Contains(body, "1-65535") {
		t.Errorf("port 70000: %d %s", code, body)
	}

	// corral port serves it on a local address.
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "corral"), "port", sb.ID, "8000")
	cmd.Env = append(cmd.Environ(), "CORRAL_URL="+p.URL, "CORRAL_TOKEN="+p.Token)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("corral port printed nothing: %v", err)
	}
	local, _, _ := strings.Cut(line, " ")
	if code, body := get(local+"/hello.txt", ""); code != 200 || body != "hello from inside\n" {
		t.Fatalf("through corral port (%s): %d %q", strings.TrimSpace(line), code, body)
	}
}
