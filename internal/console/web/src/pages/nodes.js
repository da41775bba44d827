// Nodes of a cluster (GET /v1/nodes on a cluster server; a single Corral has none).
import { h, replace, table, bytes, when, labels, errorBox } from '../dom.js';
import * as api from '../api.js';

export async function render(root) {
  let list;
  try {
    list = await api.call('/v1/nodes');
  } catch (e) {
    if (e.status === 404) replace(root, h('h1', {}, 'Nodes'), h('p', { class: 'muted', id: 'nodes' }, 'This Corral is a single node (no cluster server): its sandboxes run here.'));
    else replace(root, h('h1', {}, 'Nodes'), errorBox(e));
    return;
  }
  const res = (r) => r ? (r.cpus || 0) + ' cpus · ' + bytes(r.memory_bytes) : '';
  replace(root, h('h1', {}, 'Nodes'), table([
    { title: 'Name', get: (n) => n.name },
    { title: 'State', get: (n) => h('span', { class: 'state-' + n.state }, n.state) },
    { title: 'URL', get: (n) => h('span', { class: 'mono' }, n.url) },
    { title: 'Used / capacity', get: (n) => res(n.used) + ' / ' + res(n.capacity) },
    { title: 'Tiers', get: (n) => (n.tiers || []).join(', ') },
    { title: 'Labels', get: (n) => labels(n.labels) },
    { title: 'Heartbeat', get: (n) => when(n.heartbeat_at) },
  ], list || [], { id: 'nodes' }));
}
