// Layers and environments (GET /v1/layers, GET /v1/environments).
import { h, replace, table, bytes, when, labels, errorBox } from '../dom.js';
import * as api from '../api.js';

const ref = (r) => r || '';

// warm shows an environment's warm pool on this node (ready / target, hit rate) and sets its
// size (PATCH /v1/environments/{name} {"warm": N}).
function warm(e, reload) {
  const n = h('input', { type: 'number', min: '0', size: 4, value: String(e.warm || 0), 'aria-label': 'warm pool size of ' + e.name, 'data-warm': e.name });
  const msg = h('span', { class: 'muted' });
  return h('form', { class: 'filters', onsubmit: async (ev) => {
    ev.preventDefault();
    try {
      await api.call('/v1/environments/' + encodeURIComponent(e.name), { method: 'PATCH', json: { warm: Number(n.value) } });
      reload();
    } catch (err) { replace(msg, errorBox(err)); }
  } }, e.warm ? e.warm_ready + ' ready / ' + e.warm_target + ' target · ' + e.warm_hits + ' of ' + e.warm_claims + ' creates served (' + (100 * (e.warm_hit_rate || 0)).toFixed(0) + ' %)' : 'none',
  n, h('button', { type: 'submit' }, 'Set'), msg);
}

export async function render(root) {
  const [layers, envs] = await Promise.allSettled([api.call('/v1/layers'), api.call('/v1/environments')]);
  replace(root, h('h1', {}, 'Environments'),
    envs.status === 'rejected' ? errorBox(envs.reason) : table([
      { title: 'Name', get: (e) => e.name },
      { title: 'Project', get: (e) => e.project },
      { title: 'Base', get: (e) => ref(e.base) },
      { title: 'Workspace', get: (e) => ref(e.workspace) },
      { title: 'Toolkits', get: (e) => (e.toolkits || []).map(ref).join(', ') },
      { title: 'Start', get: (e) => (e.microvm_template ? 'microvm template' : 'boot') + (e.runtime ? ' · ' + e.runtime : '') },
      { title: 'Warm pool', get: (e) => warm(e, () => render(root)) },
      { title: 'Created', get: (e) => when(e.created_at) },
    ], envs.value || [], { id: 'environments' }),
    h('h1', {}, 'Layers'),
    layers.status === 'rejected' ? errorBox(layers.reason) : table([
      { title: 'Name', get: (l) => h('span', { class: 'mono' }, l.name + ':' + l.version) },
      { title: 'Kind', get: (l) => l.kind },
      { title: 'Tags', get: (l) => (l.tags || []).join(', ') },
      { title: 'Size', get: (l) => bytes(l.size) + ' · ' + l.files + ' files' },
      { title: 'Labels', get: (l) => labels(l.labels) },
      { title: 'Created', get: (l) => when(l.created_at) },
    ], (layers.value && layers.value.layers) || [], { id: 'layers' }));
}
