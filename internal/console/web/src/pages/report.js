// The weekly report (GET /v1/report): setup time, wall-clock per task, blocked egress per 1000
// actions, and how often TTLs were extended or killed sandboxes.
import { h, replace, table, secs, errorBox } from '../dom.js';
import * as api from '../api.js';

export async function render(root) {
  const since = h('select', {}, ['7d', '1d', '30d'].map((v) => h('option', { value: v }, 'last ' + v)));
  const project = h('input', { placeholder: 'project (default: the token\'s)', size: 24 });
  const out = h('div', { id: 'report' });
  async function load() {
    const q = { since: since.value };
    if (project.value.trim()) q.project = project.value.trim();
    try {
      const r = await api.call('/v1/report', { query: q });
      const pct = (v) => (100 * (v || 0)).toFixed(1) + ' %';
      replace(out,
        h('p', { class: 'muted' }, r.project + ' · ' + new Date(r.since).toLocaleString() + ' – ' + new Date(r.until).toLocaleString() + ' · ' + r.sandboxes + ' sandboxes'),
        h('h2', {}, 'Setup time (create → first exec)'),
        table([
          { title: 'Tier', get: (s) => s.tier },
          { title: 'Environment', get: (s) => s.environment || '—' },
          { title: 'Sandboxes', get: (s) => String(s.count) },
          { title: 'p50', get: (s) => secs(s.p50_seconds) },
          { title: 'p99', get: (s) => secs(s.p99_seconds) },
        ], r.setup || []),
        h('h2', {}, 'Wall-clock per task'),
        h('p', {}, (r.task ? r.task.count : 0) + ' tasks · p50 ' + secs(r.task && r.task.p50_seconds) + ' · p99 ' + secs(r.task && r.task.p99_seconds) +
          (r.task && r.task.tokens ? ' · ' + r.task.tokens + ' tokens (' + r.task.tokens_per_task.toFixed(0) + ' per task)' : '')),
        h('h2', {}, 'Blocked egress'),
        h('p', {}, r.blocked_egress + ' blocked in ' + r.actions + ' actions: ' + (r.blocked_per_1000_actions || 0).toFixed(2) + ' per 1000 actions'),
        h('h2', {}, 'TTL'),
        h('p', {}, 'extended: ' + r.ttl_extended + ' (' + pct(r.ttl_extended_share) + ') · killed by it: ' + r.ttl_killed + ' (' + pct(r.ttl_killed_share) + ')'));
    } catch (e) {
      replace(out, errorBox(e));
    }
  }
  replace(root, h('h1', {}, 'Weekly report'),
    h('form', { class: 'filters', onsubmit: (e) => { e.preventDefault(); load(); } }, since, project, h('button', { type: 'submit' }, 'Show')), out);
  await load();
}
