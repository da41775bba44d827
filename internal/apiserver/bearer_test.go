package apiserver

import (
	"encoding/base64"
	"net/http/httptest"
	"testing"

	"github.com/corral-dev/corral/internal/model"
)

// TestBearerSubprotocol: a browser's WebSocket offers its token as a subprotocol; the server
// takes it only on a WebSocket upgrade without an Authorization header, and removes it from the
// request in every case, keeping the other subprotocols.
func TestBearerSubprotocol(t *testing.T) {
	tok := "crl_" + "secret-token"
	offer := model.WebSocketBearerProtocol + base64.RawURLEncoding.EncodeToString([]byte(tok))
	for _, tc := range []struct {
		name              string
		upgrade, auth     string
		protocols         []string
		want, wantLeft    string
		wantAuthForwarded string
	}{
		{"websocket", "websocket", "", []string{"binary, " + offer}, "Bearer " + tok, "binary", "Bearer " + tok},
		{"two headers", "websocket", "", []string{"binary", offer}, "Bearer " + tok, "binary", "Bearer " + tok},
		{"header wins", "websocket", "Bearer crl_other", []string{"binary, " + offer}, "Bearer crl_other", "binary", "Bearer crl_other"},
		{"not a websocket", "", "", []string{offer}, "", "", ""},
		{"corral-vnc upgrade", "corral-vnc", "", []string{offer}, "", "", ""},
		{"not base64url", "websocket", "", []string{"binary, " + model.WebSocketBearerProtocol + "a+b/c="}, "", "binary", ""},
		{"no token offered", "websocket", "", []string{"binary, chat"}, "", "binary, chat", ""},
		{"none", "", "Bearer x", nil, "Bearer x", "", "Bearer x"},
	} {
		r := httptest.NewRequest("GET", "/v1/sandboxes/sb-x/vnc", nil)
		if tc.upgrade != "" {
			r.Header.Set("Connection", "Upgrade")
			r.Header.Set("Upgrade", tc.upgrade)
		}
		if tc.auth != "" {
			r.Header.Set("Authorization", tc.auth)
		}
		for _, p := range tc.protocols {
			r.Header.Add("Sec-WebSocket-Protocol", p)
		}
		if got := bearer(r); got != tc.want {
			t.Errorf("%s: bearer %q, want %q", tc.name, got, tc.want)
		}
		if got := r.Header.Get("Sec-WebSocket-Protocol"); got != tc.wantLeft || len(r.Header.Values("Sec-WebSocket-Protocol")) > 1 {
			t.Errorf("%s: the request goes on with subprotocols %q, want %q", tc.name, r.Header.Values("Sec-WebSocket-Protocol"), tc.wantLeft)
		}
		if got := r.Header.Get("Authorization"); got != tc.wantAuthForwarded {
			t.Errorf("%s: the request goes on with Authorization %q, want %q", tc.name, got, tc.wantAuthForwarded)
		}
	}
}
