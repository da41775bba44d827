// The screen tab: the sandbox's display in noVNC, live, with keyboard and mouse. It is a vm's
// machine display, or the X display inside a desktop sandbox (corral env install desktop), both
// reached through GET .../vnc upgraded to a WebSocket that carries RFB. A browser's WebSocket
// cannot send the Authorization header, so the token travels as a subprotocol
// (corral.bearer.<base64url>), never in the URL; the server takes it and does not answer it back.
import RFB from '@novnc/novnc';
import { h, replace, errorBox } from '../dom.js';
import * as api from '../api.js';

export function vncURL(id) {
  return (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + api.sandboxPath(id, 'vnc');
}

export async function render(root, sb) {
  const status = h('span', { id: 'screen-status', class: 'muted' }, 'connecting…');
  const view = h('div', { id: 'screen-view' });
  const why = h('div', { id: 'screen-error' });
  let rfb = null;
  let connected = false;
  let live = true;
  const cad = h('button', { type: 'button', id: 'screen-cad', onclick: () => rfb && rfb.sendCtrlAltDel() }, 'Send Ctrl+Alt+Del');
  const scale = h('input', { type: 'checkbox', id: 'screen-scale', checked: true });
  scale.addEventListener('change', () => { if (rfb) rfb.scaleViewport = scale.checked; });
  const viewOnly = h('input', { type: 'checkbox', id: 'screen-viewonly' });
  viewOnly.addEventListener('change', () => { if (rfb) rfb.viewOnly = viewOnly.checked; });
  const again = h('button', { type: 'button', id: 'screen-reconnect', onclick: () => connect() }, 'Reconnect');
  replace(root, h('div', { id: 'screen' },
    h('div', { class: 'filters' }, status, ' ', cad, ' ', h('label', {}, scale, ' fit to the window'), ' ',
      h('label', {}, viewOnly, ' view only'), ' ', again),
    why, view));

  // explain asks the API why the screen cannot be had: a WebSocket that fails its upgrade tells
  // the page nothing, while GET .../screen answers the same refusal (no desktop, no such
  // sandbox, not allowed) as JSON.
  async function explain() {
    try {
      await api.call(api.sandboxPath(sb.id, 'screen'), { raw: true });
      replace(why);
    } catch (e) {
      replace(why, errorBox(e));
    }
  }

  function connect() {
    if (rfb) { rfb.disconnect(); rfb = null; }
    replace(view);
    replace(why);
    view.hidden = false;
    connected = false;
    status.textContent = 'connecting…';
    const r = new RFB(view, vncURL(sb.id), { wsProtocols: ['binary', api.bearerProtocol(api.token())], shared: true });
    rfb = r;
    r.scaleViewport = scale.checked;
    r.viewOnly = viewOnly.checked;
    r.background = '#1d2433';
    r.addEventListener('connect', () => {
      connected = true;
      view.dataset.connected = 'true';
      status.textContent = 'connected to ' + (view.dataset.name || 'the display');
    });
    r.addEventListener('desktopname', (e) => { view.dataset.name = e.detail.name; });
    r.addEventListener('disconnect', (e) => {
      if (rfb !== r || !live) return;
      view.dataset.connected = 'false';
      status.textContent = connected ? 'disconnected' + (e.detail.clean ? '' : ' (the connection broke)') : 'could not connect';
      if (!connected) { view.hidden = true; explain(); }
    });
    r.addEventListener('securityfailure', (e) => { status.textContent = 'refused by the VNC server: ' + (e.detail.reason || e.detail.status); });
    r.addEventListener('credentialsrequired', () => { status.textContent = 'the VNC server asks for a password, which Corral does not set'; });
  }
  connect();
  return () => { live = false; if (rfb) rfb.disconnect(); };
}
