// The trajectory tab: every call made in the sandbox (execs, file writes, ...) as a timeline,
// with exit status and the captured output of each command.
import { h, replace, when, errorBox, secs } from '../dom.js';
import * as api from '../api.js';

export async function render(root, sb) {
  const list = h('ol', { class: 'timeline', id: 'trajectory' });
  replace(root, list);
  try {
    const resp = await api.call(api.sandboxPath(sb.id, 'trajectory'), { raw: true });
    const entries = (await resp.text()).split('\n').filter(Boolean).map((l) => JSON.parse(l));
    if (entries.length === 0) {
      replace(root, h('p', { class: 'muted' }, 'Nothing has been run in this sandbox yet.'));
      return;
    }
    for (const e of entries) {
      const req = e.request || {};
      const what = e.kind === 'exec' ? (req.argv || []).join(' ') : (req.path || req.dir || req.source || '');
      const x = e.exit;
      const took = e.ended_at ? secs((Date.parse(e.ended_at) - Date.parse(e.started_at)) / 1000) : 'running';
      const failed = x && (x.code !== 0 || x.signal || x.error);
      let out = '';
      for (const o of e.output || []) if (o.data) out += new TextDecoder().decode(api.b64(o.data));
      list.appendChild(h('li', { class: failed ? 'failed' : '' },
        h('strong', {}, '#' + e.seq + ' ' + e.kind), e.step_id ? ' [' + e.step_id + ']' : '', e.exclusive ? ' (exclusive)' : '', ' ',
        h('span', { class: 'mono' }, what), h('div', { class: 'muted' }, when(e.started_at) + ' · ' + took +
          (x ? ' · exit ' + (x.signal || x.code) + (x.error ? ' (' + x.error + ')' : '') : '')),
        out ? h('details', {}, h('summary', {}, 'output'), h('pre', {}, out)) : null));
    }
  } catch (e) {
    replace(root, errorBox(e));
  }
}
