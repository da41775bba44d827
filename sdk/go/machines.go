package corral

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
)

// MaxScreenBytes bounds a screenshot the client reads.
const MaxScreenBytes = 64 << 20

// Screenshot returns a PNG of a sandbox's display (GET /v1/sandboxes/{id}/screen: a vm's, or
// the X display in a desktop container) and its width and height in pixels. A paused sandbox is resumed first.
func (c *Client) Screenshot(ctx context.Context, id string) (png []byte, width, height int, err error) {
	resp, err := c.send(ctx, request{method: http.MethodGet, path: sandboxPath(id, "screen")})
	if err != nil {
		return nil, 0, 0, err
	}
	defer resp.Body.Close()
	png, err = io.ReadAll(io.LimitReader(resp.Body, MaxScreenBytes+1))
	if err != nil {
		return nil, 0, 0, fmt.Errorf("read screenshot: %w", err)
	}
	if len(png) > MaxScreenBytes {
		return nil, 0, 0, fmt.Errorf("screenshot larger than %d bytes", MaxScreenBytes)
	}
	width, _ = strconv.Atoi(resp.Header.Get("X-Screen-Width"))
	height, _ = strconv.Atoi(resp.Header.Get("X-Screen-Height"))
	return png, width, height, nil
}

// Input sends keyboard and mouse events to a sandbox's display (as Screenshot's), in order (POST .../input).
func (c *Client) Input(ctx context.Context, id string, events ...InputEvent) (*InputResult, error) {
	var out InputResult
	err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "input"), json: InputRequest{Events: events}}, &out)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// Type types text on a sandbox's keyboard (US layout; "\n" is Enter).
func (c *Client) Type(ctx context.Context, id, text string) error {
	_, err := c.Input(ctx, id, InputEvent{Type: InputText, Text: text})
	return err
}

// Key presses a key combination on a sandbox's keyboard ("ctrl+alt+t", "ret").
func (c *Client) Key(ctx context.Context, id, combo string) error {
	_, err := c.Input(ctx, id, InputEvent{Type: InputKey, Key: combo})
	return err
}

// Click clicks the left mouse button at x, y (screen pixels) on a sandbox's display.
func (c *Client) Click(ctx context.Context, id string, x, y int) error {
	_, err := c.Input(ctx, id, InputEvent{Type: InputClick, X: x, Y: y})
	return err
}

// Power turns a vm sandbox's machine on or off (force: pull the plug) or reboots it
// (POST .../power).
func (c *Client) Power(ctx context.Context, id string, req PowerRequest) (*Sandbox, error) {
	var out Sandbox
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "power"), json: req}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Console returns the end (at most bytes; 0: the server's 1 MiB) of a vm sandbox's serial
// console output.
func (c *Client) Console(ctx context.Context, id string, bytes int64) ([]byte, error) {
	q := url.Values{}
	if bytes > 0 {
		q.Set("bytes", strconv.FormatInt(bytes, 10))
	}
	resp, err := c.send(ctx, request{method: http.MethodGet, path: sandboxPath(id, "console"), query: q})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(io.LimitReader(resp.Body, 1<<20+1))
}

// VNCUpgrade is the Upgrade protocol of GET /v1/sandboxes/{id}/vnc.
const VNCUpgrade = "corral-vnc"

// WebSocketBearerProtocol prefixes the WebSocket subprotocol that carries a token where a
// client cannot set the Authorization header (a browser's WebSocket): "corral.bearer." followed
// by the token in unpadded base64url, offered beside the route's own subprotocol ("binary" for
// GET /v1/sandboxes/{id}/vnc). The server takes it only on a WebSocket upgrade without an
// Authorization header, and removes it before the request goes further.
const WebSocketBearerProtocol = "corral.bearer."

// VNC opens a view of a vm sandbox's display: the returned connection carries RFB (the VNC
// protocol; the server needs no password: the API token authorised it). Close it to disconnect.
// ctx bounds only the opening.
func (c *Client) VNC(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	h := http.Header{"Connection": {"Upgrade"}, "Upgrade": {VNCUpgrade}}
	resp, err := c.send(ctx, request{method: http.MethodGet, path: sandboxPath(id, "vnc"), header: h})
	if err != nil {
		return nil, err
	}
	rw, ok := resp.Body.(io.ReadWriteCloser)
	if resp.StatusCode != http.StatusSwitchingProtocols || !ok {
		resp.Body.Close()
		return nil, fmt.Errorf("vnc: the server answered %s, not 101 Switching Protocols", resp.Status)
	}
	return rw, nil
}
