// Webhooks (GET/POST /v1/webhooks, DELETE /v1/webhooks/{id}, POST .../test, GET
// .../deliveries): the list of a project's subtree, a form to add one (its secret is shown this
// once), and per webhook a test delivery, its delivery log and removal.
import { h, replace, table, when, errorBox } from '../dom.js';
import * as api from '../api.js';

// eventTypes mirrors corral.EventTypes (sdk/go/observe.go; TestEventTypes keeps them equal).
export const eventTypes = ['created', 'started', 'paused', 'resumed', 'forked', 'oom', 'ttl_expired', 'idle_expired', 'deleted', 'failed', 'egress_blocked', 'quota_refused', 'node_state'];

const filter = { project: '' };

export async function render(root) {
  const list = h('div', { id: 'webhook-list' });
  const log = h('div', { id: 'webhook-log' });
  const status = h('div', { id: 'webhook-status' });
  const project = h('input', { name: 'project', id: 'webhook-project', placeholder: 'project (default: the token\'s)', size: 24 });
  const url = h('input', { name: 'url', id: 'webhook-url', placeholder: 'https://hooks.example.com/corral', size: 40, required: true });
  const boxes = eventTypes.map((t) => h('label', { class: 'check' }, h('input', { type: 'checkbox', value: t, 'data-event': t }), ' ' + t));
  const shown = h('input', { placeholder: 'project (default: the token\'s)', size: 24, id: 'webhook-filter' });
  shown.value = filter.project;

  async function load() {
    const q = filter.project ? { project: filter.project } : {};
    try {
      const hooks = await api.call('/v1/webhooks', { query: q });
      replace(list, (hooks || []).length === 0 ? h('p', { class: 'muted' }, 'No webhooks.') : table([
        { title: 'ID', get: (w) => h('span', { class: 'mono' }, w.id) },
        { title: 'Project', get: (w) => w.project },
        { title: 'URL', get: (w) => h('span', { class: 'mono' }, w.url) },
        { title: 'Events', get: (w) => (w.events || []).join(', ') || 'all' },
        { title: 'Created', get: (w) => when(w.created_at) + (w.created_by ? ' by ' + w.created_by : '') },
        { title: '', get: (w) => [
          h('button', { 'data-test': w.id, onclick: () => test(w) }, 'Test'), ' ',
          h('button', { 'data-deliveries': w.id, onclick: () => deliveries(w) }, 'Deliveries'), ' ',
          h('button', { 'data-remove': w.id, onclick: () => remove(w) }, 'Remove')] },
      ], hooks, { id: 'webhooks' }));
    } catch (e) {
      replace(list, errorBox(e));
    }
  }

  async function test(w) {
    replace(status, h('span', { class: 'muted' }, 'sending a test event to ' + w.url + '…'));
    try {
      const d = await api.call('/v1/webhooks/' + encodeURIComponent(w.id) + '/test', { method: 'POST' });
      replace(status, h('div', { class: d.result === 'ok' ? 'ok' : 'error', 'data-result': d.result },
        'test ' + d.event + ': ' + d.result + (d.status ? ' (' + d.status + ')' : '') + ' in ' + d.duration_ms.toFixed(1) + ' ms' + (d.error ? ': ' + d.error : '')));
      deliveries(w);
    } catch (e) {
      replace(status, errorBox(e));
    }
  }

  async function deliveries(w) {
    try {
      const ds = await api.call('/v1/webhooks/' + encodeURIComponent(w.id) + '/deliveries');
      replace(log, h('h2', {}, 'Deliveries of ', h('span', { class: 'mono' }, w.id)), (ds || []).length === 0 ? h('p', { class: 'muted' }, 'None yet.') : table([
        { title: 'At', get: (d) => when(d.at) },
        { title: 'Event', get: (d) => h('span', { class: 'mono' }, d.event) },
        { title: 'Type', get: (d) => d.type },
        { title: 'Attempt', get: (d) => String(d.attempt) },
        { title: 'Status', get: (d) => d.status ? String(d.status) : '—' },
        { title: 'Result', get: (d) => d.result },
        { title: 'ms', get: (d) => d.duration_ms.toFixed(1) },
        { title: 'Error', get: (d) => d.error || '' },
      ], ds, { id: 'deliveries' }));
    } catch (e) {
      replace(log, errorBox(e));
    }
  }

  async function remove(w) {
    if (!confirm('Remove webhook ' + w.id + ' (' + w.url + ')?')) return;
    try {
      await api.call('/v1/webhooks/' + encodeURIComponent(w.id), { method: 'DELETE' });
      replace(status, h('span', { class: 'muted' }, 'removed ' + w.id));
      replace(log);
      load();
    } catch (e) {
      replace(status, errorBox(e));
    }
  }

  const form = h('form', {
    id: 'webhook-add',
    class: 'filters',
    onsubmit: async (e) => {
      e.preventDefault();
      const req = { url: url.value.trim() };
      if (project.value.trim()) req.project = project.value.trim();
      const events = boxes.map((b) => b.firstChild).filter((c) => c.checked).map((c) => c.value);
      if (events.length) req.events = events;
      try {
        const w = await api.call('/v1/webhooks', { method: 'POST', json: req });
        replace(status, h('div', { class: 'ok', id: 'webhook-secret' }, 'Added ' + w.id + '. Its secret, shown this once (receivers check the Corral-Signature header with it): ',
          h('span', { class: 'mono' }, w.secret)));
        url.value = '';
        load();
      } catch (err) {
        replace(status, errorBox(err));
      }
    },
  }, project, url, h('button', { type: 'submit', id: 'webhook-add-button' }, 'Add webhook'), h('div', { class: 'checks' }, 'Events (none ticked: all): ', boxes));

  replace(root, h('h1', {}, 'Webhooks'),
    h('form', { class: 'filters', onsubmit: (e) => { e.preventDefault(); filter.project = shown.value.trim(); load(); } }, shown, h('button', { type: 'submit' }, 'Show')),
    list, h('h2', {}, 'Add a webhook'), form, status, log);
  await load();
}
