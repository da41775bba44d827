// Projects with their quotas and usage (GET /v1/projects, GET /v1/quotas/{path}).
import { h, replace, table, bytes, when, errorBox } from '../dom.js';
import * as api from '../api.js';

const resources = [
  ['sandboxes', 'sandboxes', String],
  ['cpus', 'cpus', String],
  ['memory', 'memory_bytes', bytes],
  ['disk', 'disk_bytes', bytes],
  ['creates/min', 'creates_per_minute', String],
];

function usage(q) {
  if (!q) return '…';
  return h('div', {}, resources.map(([name, key, fmt]) => {
    const lim = q.limit && q.limit[key];
    const used = q.usage ? q.usage[key] || 0 : 0;
    return h('div', {}, name + ': ' + fmt(used) + (lim !== undefined && lim !== null ? ' / ' + fmt(lim) : ''));
  }));
}

export async function render(root) {
  const list = await api.call('/v1/projects');
  const cells = new Map();
  replace(root, h('h1', {}, 'Projects'), table([
    { title: 'Path', get: (p) => h('span', { class: 'mono' }, p.path) },
    { title: 'Sandboxes', get: (p) => String(p.sandboxes) },
    { title: 'Quota (usage / limit)', get: (p) => { const c = h('div', {}, '…'); cells.set(p.path, c); return c; } },
    { title: 'Created', get: (p) => when(p.created_at) + (p.created_by ? ' by ' + p.created_by : '') },
  ], list || [], { id: 'projects' }));
  for (const p of list || []) {
    api.call('/v1/quotas/' + api.projectPath(p.path)).then((q) => replace(cells.get(p.path), usage(q)), (e) => replace(cells.get(p.path), errorBox(e)));
  }
}
