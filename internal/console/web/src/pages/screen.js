// The screen tab of a vm sandbox: its display, refreshed from GET .../screen (PNG) about once a
// second, with clicks and typed text sent as POST .../input. (An RFB view through noVNC would
// need a WebSocket, which cannot carry the Authorization header; see docs/ARCHITECTURE.md.)
import { h, replace } from '../dom.js';
import * as api from '../api.js';

export async function render(root, sb) {
  const img = h('img', { alt: 'screen of ' + sb.id, id: 'screen-image', tabindex: '0' });
  const text = h('input', { placeholder: 'type text, Enter sends', size: 40 });
  const status = h('span', { class: 'muted' });
  replace(root, h('div', { id: 'screen' },
    h('form', { class: 'filters', onsubmit: (e) => { e.preventDefault(); send([{ type: 'text', text: text.value + '\n' }]); text.value = ''; } },
      text, h('button', { type: 'submit' }, 'Type'), status), img));
  let w = 0, ht = 0, url = null, live = true;
  async function send(events) {
    try { await api.call(api.sandboxPath(sb.id, 'input'), { method: 'POST', json: { events } }); refresh(); } catch (e) { status.textContent = e.message; }
  }
  img.addEventListener('click', (e) => {
    const r = img.getBoundingClientRect();
    if (!w || !r.width) return;
    send([{ type: 'click', x: Math.round((e.clientX - r.left) * w / r.width), y: Math.round((e.clientY - r.top) * ht / r.height) }]);
  });
  async function refresh() {
    try {
      const resp = await api.call(api.sandboxPath(sb.id, 'screen'), { raw: true });
      w = Number(resp.headers.get('X-Screen-Width')) || 0;
      ht = Number(resp.headers.get('X-Screen-Height')) || 0;
      const next = URL.createObjectURL(await resp.blob());
      img.src = next;
      if (url) URL.revokeObjectURL(url);
      url = next;
      status.textContent = '';
    } catch (e) {
      status.textContent = e.message;
    }
  }
  (async () => { while (live) { await refresh(); await new Promise((r) => setTimeout(r, 1000)); } })();
  return () => { live = false; if (url) URL.revokeObjectURL(url); };
}
