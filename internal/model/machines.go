package model

// WebSocketBearerProtocol prefixes the WebSocket subprotocol that carries a token where a
// client cannot set the Authorization header (a browser's WebSocket): "corral.bearer." followed
// by the token in unpadded base64url, offered beside the route's own subprotocol ("binary" for
// GET /v1/sandboxes/{id}/vnc). The server takes it only on a WebSocket upgrade without an
// Authorization header, and removes it before the request goes further.
const WebSocketBearerProtocol = "corral.bearer."
