package cli

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/revproxy"
)

// newPortCmd returns `corral port`: a local address forwarded to a TCP port inside a sandbox.
func (a *app) newPortCmd() *cobra.Command {
	var listen string
	cmd := &cobra.Command{
		Use:   "port ID PORT [--listen ADDR]",
		Short: "Serve a port inside a sandbox on a local address (HTTP and WebSocket, through the API)",
		Long: `Serve HTTP on a local address and forward every request to PORT on the sandbox's own
loopback, through the API (GET /v1/sandboxes/ID/ports/PORT/...; needs sandbox.use). The port needs
no network policy: the edge connects from inside the sandbox's network namespace. Stops with
Ctrl-C.`,
		Example: `  corral exec sb-local-... -- python3 -m http.server 8000 &
  corral port sb-local-... 8000 --listen 127.0.0.1:8000   # then open http://127.0.0.1:8000`,
		Args: exactArgs(2, "a sandbox ID and a PORT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := strconv.Atoi(args[1])
			if err != nil || port < 1 || port > 65535 {
				return usagef("PORT %q: want 1-65535", args[1])
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			// The sandbox must exist and be reachable before anything is served.
			if _, err := c.GetSandbox(cmd.Context(), args[0]); err != nil {
				return err
			}
			base, err := url.Parse(strings.TrimRight(a.url, "/") + "/v1/sandboxes/" + args[0] + "/ports/" + strconv.Itoa(port))
			if err != nil {
				return usagef("server URL %q: %v", a.url, err)
			}
			proxy := &httputil.ReverseProxy{
				Rewrite: func(pr *httputil.ProxyRequest) {
					pr.Out.URL.Scheme, pr.Out.URL.Host = base.Scheme, base.Host
					pr.Out.URL.Path = base.Path + "/" + strings.TrimPrefix(pr.In.URL.Path, "/")
					pr.Out.URL.RawPath = ""
					pr.Out.Host = base.Host
					pr.Out.Header.Set("Authorization", "Bearer "+a.token)
				},
				FlushInterval: -1,
			}
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", listen, err)
			}
			fmt.Fprintf(a.stdout, "http://%s -> port %d of %s (Ctrl-C stops)\n", lis.Addr(), port, args[0])
			srv := &http.Server{Handler: revproxy.Handler(proxy), ReadHeaderTimeout: 10 * time.Second}
			go func() {
				<-cmd.Context().Done()
				srv.Close()
			}()
			if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "local address to serve on (port 0: any free one)")
	return cmd
}
