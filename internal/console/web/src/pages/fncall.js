// Function-call pools (GET /v1/fncall).
import { h, replace, table } from '../dom.js';
import * as api from '../api.js';

export async function render(root) {
  const list = await api.call('/v1/fncall');
  replace(root, h('h1', {}, 'Fncall pools'), (list || []).length === 0 ? h('p', { class: 'muted' }, 'No fncall environments.') : table([
    { title: 'Name', get: (f) => f.name },
    { title: 'Project', get: (f) => f.project },
    { title: 'Base', get: (f) => f.base || '' },
    { title: 'Pool', get: (f) => 'min ' + f.pool_min + (f.pool_max ? ', max ' + f.pool_max : '') },
    { title: 'Warm pool now', get: (f) => f.pool ? f.pool.ready + ' ready · ' + f.pool.busy + ' busy · ' + f.pool.starting + ' starting · ' + f.pool.queued + ' queued · ' + f.pool.calls + ' calls' + (f.pool.last_error ? ' · last error: ' + f.pool.last_error : '') : '' },
  ], list, { id: 'fncall' }));
}
