// The sandboxes page: the list (filtered by project, state and label on the server, by tier
// here), a page at a time so a thousand sandboxes never become a thousand rows, and a live feed
// from GET /v1/events?follow=true that refreshes the list as sandboxes change.
import { h, replace, table, when, labels, errorBox } from '../dom.js';
import * as api from '../api.js';

export const pageSize = 50;

const states = ['', 'creating', 'running', 'paused', 'off', 'stopped', 'failed'];
const tiers = ['', 'container', 'microvm', 'vm'];

// Filters and the page number survive leaving the page and coming back.
const filter = { project: '', state: '', label: '', tier: '', page: 0 };

export async function render(root) {
  const abort = new AbortController();
  const listBox = h('div', { id: 'sandbox-list' });
  const feed = h('div', { class: 'feed', id: 'events' });
  const status = h('span', { class: 'muted', id: 'events-status' }, 'connecting…');
  const field = (name, el) => { el.value = filter[name]; el.name = name; return el; };
  const form = h('form', {
    class: 'filters',
    onsubmit: (e) => {
      e.preventDefault();
      for (const el of form.elements) if (el.name) filter[el.name] = el.value.trim();
      filter.page = 0;
      load();
    },
  },
  field('project', h('input', { placeholder: 'project (e.g. /acme)', size: 16 })),
  field('state', h('select', {}, states.map((s) => h('option', { value: s }, s || 'any state')))),
  field('label', h('input', { placeholder: 'label KEY=VALUE', size: 16 })),
  field('tier', h('select', {}, tiers.map((s) => h('option', { value: s }, s || 'any tier')))),
  h('button', { type: 'submit' }, 'Filter'));

  replace(root, h('h1', {}, 'Sandboxes ', h('a', { href: '#/new', class: 'button', id: 'new-sandbox-link' }, 'New sandbox')), form, listBox,
    h('h2', {}, 'Events ', status), feed);

  let all = [];
  async function load() {
    const q = new URLSearchParams();
    if (filter.project) q.set('project', filter.project);
    if (filter.state) q.set('state', filter.state);
    if (filter.label) q.set('label', filter.label);
    try {
      const out = await api.call('/v1/sandboxes', { query: q, signal: abort.signal });
      all = (out.sandboxes || []).filter((s) => !filter.tier || s.tier === filter.tier);
      all.sort((a, b) => (b.created_at || '').localeCompare(a.created_at || ''));
      draw();
    } catch (e) {
      if (!abort.signal.aborted) replace(listBox, errorBox(e));
    }
  }

  function draw() {
    const pages = Math.max(1, Math.ceil(all.length / pageSize));
    filter.page = Math.min(filter.page, pages - 1);
    const rows = all.slice(filter.page * pageSize, (filter.page + 1) * pageSize);
    const go = (p) => () => { filter.page = p; draw(); };
    replace(listBox,
      h('div', { class: 'pager' },
        h('span', { id: 'sandbox-count' }, all.length + ' sandbox' + (all.length === 1 ? '' : 'es')),
        h('button', { onclick: go(filter.page - 1), disabled: filter.page === 0 }, '‹ prev'),
        h('span', {}, 'page ' + (filter.page + 1) + ' of ' + pages),
        h('button', { onclick: go(filter.page + 1), disabled: filter.page >= pages - 1 }, 'next ›')),
      table([
        { title: 'ID', get: (s) => h('a', { href: '#/sandboxes/' + encodeURIComponent(s.id), class: 'mono' }, s.id) },
        { title: 'State', get: (s) => h('span', { class: 'state-' + s.state }, s.state) },
        { title: 'Tier', get: (s) => s.tier + (s.runtime ? ' / ' + s.runtime : '') },
        { title: 'Project', get: (s) => s.project },
        { title: 'Labels', get: (s) => labels(s.labels) },
        { title: 'Created', get: (s) => when(s.created_at) },
        { title: 'Expires', get: (s) => when(s.expires_at) },
      ], rows, { id: 'sandboxes' }));
  }

  // Events refresh the list, at most every half second however many arrive.
  let pending = null;
  function refreshSoon() {
    if (pending) return;
    pending = setTimeout(() => { pending = null; load(); }, 500);
  }
  async function follow() {
    let last = '';
    while (!abort.signal.aborted) {
      // A reconnect asks for what it missed since the last event it saw.
      const q = { follow: 'true' };
      if (filter.project) q.project = filter.project;
      if (last) q.since = last;
      try {
        await api.lines('/v1/events', q, (ev) => {
          if (ev.code) throw new Error(ev.message || ev.code);
          last = ev.at;
          const line = h('div', { class: 'event' }, new Date(ev.at).toLocaleTimeString() + ' ' + ev.type + ' ',
            ev.sandbox ? h('a', { href: '#/sandboxes/' + encodeURIComponent(ev.sandbox) }, ev.sandbox) : null,
            ev.reason ? ' (' + ev.reason + ')' : '', ev.count ? ' ×' + ev.count : '');
          feed.prepend(line);
          while (feed.childNodes.length > 100) feed.lastChild.remove();
          if (ev.sandbox) refreshSoon();
        }, abort.signal, () => replace(status, h('span', { class: 'live' }, '● live')));
      } catch (e) {
        if (abort.signal.aborted) return;
        status.textContent = 'disconnected (' + (e.message || e) + '), retrying…';
      }
      await new Promise((r) => setTimeout(r, 2000));
    }
  }
  await load();
  follow();
  return () => { abort.abort(); clearTimeout(pending); };
}
