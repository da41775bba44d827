package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestRedTeamWebhook: a tenant's webhook as a way into the host's network (SSRF). Pointed at
// Corral's own API on loopback, at a private address or at the cloud metadata address by an
// address literal, it is refused when it is added (400). Pointed there by a name, which may
// resolve anywhere at any time, its deliveries are refused at the dial, logged as failed and
// counted; nothing is sent. A URL that is not http(s) is refused when the webhook is added.
func TestRedTeamWebhook(t *testing.T) {
	x := newTenancyWith(t, "--webhook-attempts", "1", "--webhook-timeout", "2s")
	p, ctx := x.p, t.Context()
	_, port, _ := strings.Cut(p.Listen, ":")
	for _, u := range []string{
		"http://127.0.0.1:" + port + "/v1/sandboxes",
		"http://localhost:" + port + "/healthz",
		"http://10.0.0.1/x",
		"http://169.254.169.254/latest/meta-data/",
		"http://[::1]:" + port + "/",
		"http://[::ffff:127.0.0.1]:" + port + "/",
		"gopher://127.0.0.1:" + port + "/", "file:///etc/shadow", "unix:///run/corral.sock",
	} {
		if _, err := x.a.CreateWebhook(ctx, corral.WebhookRequest{URL: u}); !corral.IsInvalid(err) {
			t.Errorf("webhook to %s: %v, want invalid", u, err)
		}
	}
	// A name of this host's that resolves to a private address: accepted, then refused at the
	// dial. (Debian's /etc/hosts maps the host name to a loopback address.)
	host, _ := os.Hostname()
	addrs, _ := net.LookupHost(host)
	private := len(addrs) > 0
	for _, a := range addrs {
		if ip, err := netip.ParseAddr(a); err != nil || !(ip.IsLoopback() || ip.IsPrivate()) {
			private = false
		}
	}
	if !private {
		t.Skipf("the host name %q resolves to %v, not only to private addresses: no name to test the dial-time guard with", host, addrs)
	}
	var hooks []corral.Webhook
	for _, u := range []string{"http://" + net.JoinHostPort(host, port) + "/v1/sandboxes"} {
		h, err := x.a.CreateWebhook(ctx, corral.WebhookRequest{URL: u, Events: []string{corral.EventCreated}})
		if err != nil {
			t.Fatalf("add webhook %s: %v", u, err)
		}
		hooks = append(hooks, *h)
	}
	if _, err := x.a.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test"}); err != nil {
		t.Fatal(err)
	}
	for _, h := range hooks {
		eventually(t, 30*time.Second, "the delivery to "+h.URL+" refused", func() bool {
			log, err := x.a.WebhookDeliveries(ctx, h.ID)
			return err == nil && len(log) == 1 && log[0].Result == "failed" && log[0].Status == 0 &&
				strings.Contains(log[0].Error, "not a public address")
		})
	}
	if prom := p.promText(t); !strings.Contains(prom, fmt.Sprintf(`corral_webhook_deliveries_total{outcome="failed"} %d`, len(hooks))) {
		t.Errorf("refusals not counted:\n%s", grepLines(prom, "webhook"))
	}
}
