// A sandbox's page: its state, limits and network policy with the attempts it blocked, live
// metrics charts, the trajectory as a timeline, a terminal, a file browser and the screen (noVNC,
// for vm and desktop sandboxes). Each tab is a module; only the open one runs.
import { h, replace, bytes, when, labels, errorBox, section } from '../dom.js';
import * as api from '../api.js';
import { Chart } from '../chart.js';
import * as terminal from './terminal.js';
import * as files from './files.js';
import * as screen from './screen.js';
import * as trajectory from './trajectory.js';

export async function render(root, [id]) {
  const sb = await api.call(api.sandboxPath(id));
  const tabs = [
    { name: 'Overview', render: overview },
    { name: 'Trajectory', render: trajectory.render },
    { name: 'Terminal', render: terminal.render },
    { name: 'Files', render: files.render },
  ];
  // Every sandbox may have a display (a vm's, or a desktop environment's X server); the tab says
  // so when this one has none.
  tabs.push({ name: 'Screen', render: screen.render });
  const body = h('div', { id: 'tab' });
  let stop = null;
  const bar = h('div', { class: 'tabs', role: 'tablist' });
  async function open(t) {
    if (stop) { stop(); stop = null; }
    for (const b of bar.children) b.classList.toggle('active', b.textContent === t.name);
    replace(body);
    try {
      const s = await t.render(body, sb);
      stop = typeof s === 'function' ? s : null; // as in main.js's route
    } catch (e) {
      replace(body, errorBox(e));
    }
  }
  for (const t of tabs) bar.appendChild(h('button', { role: 'tab', 'data-tab': t.name.toLowerCase(), onclick: () => open(t) }, t.name));
  const actions = h('span', {},
    h('button', { onclick: () => act('pause') }, 'Pause'), ' ',
    h('button', { onclick: () => act('resume') }, 'Resume'), ' ',
    h('button', { onclick: () => { if (confirm('Delete ' + id + '?')) api.call(api.sandboxPath(id), { method: 'DELETE' }).then(() => { location.hash = '#/sandboxes'; }, (e) => alert(e.message)); } }, 'Delete'));
  async function act(what) {
    try {
      Object.assign(sb, await api.call(api.sandboxPath(id, what), { method: 'POST' }));
      open(tabs[0]);
    } catch (e) { alert(e.message); }
  }
  replace(root, h('h1', {}, h('a', { href: '#/sandboxes' }, 'Sandboxes'), ' / ', h('span', { class: 'mono', id: 'sandbox-id' }, id), ' ', actions), bar, body);
  await open(tabs[0]);
  return () => { if (stop) stop(); };
}

function kv(pairs) {
  return h('dl', { class: 'kv' }, pairs.filter(Boolean).map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
}

const ref = (r) => (typeof r === 'string' ? r || '—' : r && r.name ? r.name + (r.version ? ':' + r.version : '') : '—');

async function overview(root, sb) {
  const l = sb.limits || {};
  const net = sb.network || { mode: 'none' };
  const blocked = h('div', { id: 'blocked' }, h('span', { class: 'muted' }, 'loading…'));
  const charts = h('div', { class: 'grid', id: 'metrics' });
  replace(root, h('div', { class: 'grid' },
    h('div', { class: 'card' }, section('State', kv([
      ['state', h('span', { class: 'state-' + sb.state, id: 'sandbox-state' }, sb.state)],
      sb.reason && ['reason', sb.reason],
      ['tier', sb.tier + ' / ' + sb.runtime],
      ['node', sb.node],
      ['project', sb.project],
      ['environment', sb.environment || '—'],
      ['base', ref(sb.base)],
      ['created', when(sb.created_at)],
      ['expires', when(sb.expires_at)],
      ['last activity', when(sb.last_activity_at)],
      ['labels', h('span', { id: 'sandbox-labels' }, labels(sb.labels))],
    ]))),
    h('div', { class: 'card' }, section('Limits', kv([
      ['cpus', String(l.cpus || '—')],
      ['memory', bytes(l.memory_bytes)],
      ['disk', bytes(l.disk_bytes)],
      ['pids', String(l.pids || '—')],
      ['open files', String(l.open_files || '—')],
      ['output', bytes(l.output_bytes)],
    ]))),
    h('div', { class: 'card' }, section('Network', kv([
      ['mode', net.mode || 'none'],
      net.allow && ['allow', net.allow.join(', ')],
      net.deny && ['deny', net.deny.join(', ')],
      sb.network_address && ['address', sb.network_address],
    ]), h('h3', {}, 'Blocked attempts'), blocked))),
  section('Metrics', charts));

  api.call(api.sandboxPath(sb.id, 'network', 'blocked')).then((list) => {
    list = list || [];
    replace(blocked, list.length === 0 ? h('span', { class: 'muted' }, 'none') :
      h('ul', {}, list.slice(-50).reverse().map((b) => h('li', {}, when(b.at) + ': ' + b.protocol + ' ' + (b.name || b.dest || '') + (b.port ? ':' + b.port : '') + ' — ' + b.reason))));
  }, (e) => replace(blocked, errorBox(e)));

  const series = [
    ['CPU', 'cpu_percent', (v) => v.toFixed(1) + ' %'],
    ['Memory', 'memory_bytes', bytes],
    ['Disk (writable)', 'disk_bytes', bytes],
    ['Processes', 'pids', (v) => v.toFixed(0)],
    ['Network in', 'net_rx_bytes', bytes],
    ['Network out', 'net_tx_bytes', bytes],
  ].map(([title, key, fmt]) => {
    const canvas = h('canvas', { class: 'chart', 'data-metric': key });
    const value = h('span', { class: 'mono' }, '—');
    charts.appendChild(h('div', {}, h('div', { class: 'chart-title' }, h('span', {}, title), value), canvas));
    return { key, chart: new Chart(canvas, fmt), value };
  });
  let samples = [];
  async function poll() {
    try {
      const since = samples.length ? samples[samples.length - 1].at : '';
      const out = await api.call(api.sandboxPath(sb.id, 'metrics'), { query: since ? { since } : {} });
      const fresh = (out.samples || []).filter((s) => !since || s.at > since);
      samples = samples.concat(fresh).slice(-720);
      charts.dataset.samples = String(samples.length);
      for (const s of series) s.value.textContent = s.chart.draw(samples.map((x) => ({ t: Date.parse(x.at), v: x[s.key] || 0 })));
    } catch (e) {
      charts.dataset.error = e.message;
    }
  }
  await poll();
  const timer = setInterval(poll, 5000);
  return () => clearInterval(timer);
}
