// Layers and environments (GET /v1/layers, GET /v1/environments).
import { h, replace, table, bytes, when, labels, errorBox } from '../dom.js';
import * as api from '../api.js';

const ref = (r) => r || '';

export async function render(root) {
  const [layers, envs] = await Promise.allSettled([api.call('/v1/layers'), api.call('/v1/environments')]);
  replace(root, h('h1', {}, 'Environments'),
    envs.status === 'rejected' ? errorBox(envs.reason) : table([
      { title: 'Name', get: (e) => e.name },
      { title: 'Project', get: (e) => e.project },
      { title: 'Base', get: (e) => ref(e.base) },
      { title: 'Workspace', get: (e) => ref(e.workspace) },
      { title: 'Toolkits', get: (e) => (e.toolkits || []).map(ref).join(', ') },
      { title: 'Start', get: (e) => (e.microvm_template ? 'microvm template' : 'boot') },
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
