// The API client: every call carries the signed-in user's token in an Authorization header,
// so the console can do exactly what that token may and nothing more. The token lives in
// sessionStorage (this tab only, gone when it closes), never in a cookie or the URL.

const KEY = 'corral.token';

export function token() { return sessionStorage.getItem(KEY) || ''; }
export function setToken(t) { sessionStorage.setItem(KEY, t); }
export function signOut() { sessionStorage.removeItem(KEY); }

// takeTokenFromURL reads a token passed once as /ui/#token=..., keeps it, and removes it from
// the address bar and history, so it is not left in the URL to be copied or bookmarked.
export function takeTokenFromURL() {
  const m = /^#token=([^&]+)/.exec(location.hash);
  if (!m) return;
  setToken(decodeURIComponent(m[1]));
  history.replaceState(null, '', location.pathname + location.search + '#/sandboxes');
}

// bearerProtocol is the token as a WebSocket subprotocol (corral.WebSocketBearerProtocol in the
// Go SDK): a browser's WebSocket cannot send an Authorization header, and a token in the URL
// would be logged and kept in history, so it is offered as "corral.bearer." and the token in
// unpadded base64url; the server takes it and never answers it back.
export function bearerProtocol(t) {
  let s = '';
  for (const b of new TextEncoder().encode(t)) s += String.fromCharCode(b);
  return 'corral.bearer.' + btoa(s).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

export class APIError extends Error {
  constructor(status, body) {
    super((body && body.message) || 'HTTP ' + status);
    this.status = status;
    this.code = body && body.code;
  }
}

function headers(extra) {
  return Object.assign({ Authorization: 'Bearer ' + token() }, extra || {});
}

// call makes an API request and returns the decoded JSON (null for an empty answer). opts:
// method, json (a body to encode), body (sent as is), query (an object or URLSearchParams),
// raw (return the Response).
export async function call(path, opts) {
  opts = opts || {};
  let url = path;
  if (opts.query) {
    const q = new URLSearchParams(opts.query).toString();
    if (q) url += '?' + q;
  }
  const init = { method: opts.method || 'GET', headers: headers(opts.headers), signal: opts.signal };
  if (opts.json !== undefined) {
    init.body = JSON.stringify(opts.json);
    init.headers['Content-Type'] = 'application/json';
  } else if (opts.body !== undefined) {
    init.body = opts.body;
    init.headers['Content-Type'] = 'application/octet-stream';
  }
  const resp = await fetch(url, init);
  if (!resp.ok) {
    let body = null;
    try { body = await resp.json(); } catch (e) { /* not JSON */ }
    if (resp.status === 401) window.dispatchEvent(new CustomEvent('corral:unauthorized'));
    throw new APIError(resp.status, body);
  }
  if (opts.raw) return resp;
  const text = await resp.text();
  return text ? JSON.parse(text) : null;
}

// lines streams an NDJSON response, calling onLine with each decoded line until the response
// ends or signal aborts; onOpen, if given, runs once the response has begun. EventSource cannot
// send an Authorization header, so this reads a fetch body as a stream instead.
export async function lines(path, query, onLine, signal, onOpen) {
  const resp = await call(path, { query, raw: true, signal });
  if (onOpen) onOpen();
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, i).trim();
      buf = buf.slice(i + 1);
      if (line) onLine(JSON.parse(line));
    }
  }
  if (buf.trim()) onLine(JSON.parse(buf));
}

export function sandboxPath(id, ...rest) {
  return ['/v1/sandboxes', encodeURIComponent(id), ...rest].join('/');
}

export function projectPath(p) {
  return String(p || '').split('/').filter(Boolean).map(encodeURIComponent).join('/');
}

// b64 decodes the base64 of a []byte field into bytes.
export function b64(s) {
  const bin = atob(s || '');
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}
