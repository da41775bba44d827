// The new-sandbox page: a form for POST /v1/sandboxes (corral.CreateRequest). The sandbox is
// made from a saved environment, or from a base layer with a workspace and toolkits, or (vm
// tier) from a disk image; with a tier and runtime, limits, a network policy (allow and deny
// rules), TTLs and labels. createRequest turns the form's strings into the request; the API
// checks every field and its refusal is shown as it says.
import { h, replace, errorBox } from '../dom.js';
import * as api from '../api.js';

const MiB = 1024 * 1024;

// lines splits a textarea into its non-empty trimmed lines.
function lines(s) {
  return String(s || '').split('\n').map((l) => l.trim()).filter(Boolean);
}

function number(name, s, scale) {
  s = String(s || '').trim();
  if (!s) return undefined;
  const n = Number(s);
  if (!Number.isFinite(n) || n <= 0) throw new Error(name + ': "' + s + '" is not a positive number');
  return scale ? Math.round(n * scale) : n;
}

// createRequest builds the body of POST /v1/sandboxes from the form's values (strings, as the
// inputs hold them; memory and disk in MiB; labels and env one KEY=VALUE per line; allow and deny
// one rule per line, toolkits one per line or comma-separated). Empty fields are left out, so
// the server's defaults apply. It throws on what is not even well-formed (a label without =).
export function createRequest(v) {
  const req = {};
  const str = (k) => String(v[k] || '').trim();
  if (str('project')) req.project = str('project');
  if (str('tier')) req.tier = str('tier');
  if (str('runtime')) req.runtime = str('runtime');
  if (str('environment')) req.environment = str('environment');
  if (str('image')) req.image = str('image');
  if (str('base')) req.base = str('base');
  if (str('workspace')) req.workspace = str('workspace');
  const toolkits = lines(String(v.toolkits || '').replace(/,/g, '\n'));
  if (toolkits.length) req.toolkits = toolkits;
  const limits = {
    cpus: number('cpus', v.cpus),
    memory_bytes: number('memory', v.memory_mib, MiB),
    disk_bytes: number('disk', v.disk_mib, MiB),
    pids: number('pids', v.pids),
    open_files: number('open files', v.open_files),
  };
  for (const k of Object.keys(limits)) if (limits[k] === undefined) delete limits[k];
  if (Object.keys(limits).length) req.limits = limits;
  const allow = lines(v.allow);
  const deny = lines(v.deny);
  if (str('network') || allow.length || deny.length) {
    req.network = {};
    if (str('network')) req.network.mode = str('network');
    if (allow.length) req.network.allow = allow;
    if (deny.length) req.network.deny = deny;
  }
  if (str('ttl')) req.ttl = str('ttl');
  if (str('idle_ttl')) req.idle_ttl = str('idle_ttl');
  if (str('auto_pause_after')) req.auto_pause_after = str('auto_pause_after');
  const labels = {};
  for (const l of lines(v.labels)) {
    const i = l.indexOf('=');
    if (i <= 0) throw new Error('label "' + l + '": want KEY=VALUE');
    labels[l.slice(0, i).trim()] = l.slice(i + 1).trim();
  }
  if (Object.keys(labels).length) req.labels = labels;
  const env = lines(v.env);
  for (const e of env) if (e.indexOf('=') <= 0) throw new Error('environment variable "' + e + '": want KEY=VALUE');
  if (env.length) req.env = env;
  return req;
}

export async function render(root) {
  const [envs, layers] = await Promise.allSettled([api.call('/v1/environments'), api.call('/v1/layers')]);
  const envList = envs.status === 'fulfilled' ? envs.value || [] : [];
  const layerList = layers.status === 'fulfilled' ? (layers.value && layers.value.layers) || [] : [];
  const refs = (kind) => layerList.filter((l) => !kind || l.kind === kind).map((l) => l.name + ':' + l.version);
  const datalist = (id, values) => h('datalist', { id }, values.map((x) => h('option', { value: x })));
  const field = (label, el, hint) => h('label', { class: 'field' }, h('span', {}, label), el, hint ? h('small', { class: 'muted' }, hint) : null);
  const input = (name, attrs) => h('input', Object.assign({ name, id: 'new-' + name.replace(/_/g, '-') }, attrs || {}));
  const area = (name, attrs) => h('textarea', Object.assign({ name, id: 'new-' + name.replace(/_/g, '-'), rows: 3, cols: 40 }, attrs || {}));
  const select = (name, options) => h('select', { name, id: 'new-' + name }, options.map(([v, t]) => h('option', { value: v }, t)));
  const status = h('div', { id: 'new-status' });
  const form = h('form', { id: 'new-sandbox', class: 'form' },
    h('fieldset', {}, h('legend', {}, 'What it runs'),
      field('Project', input('project', { placeholder: 'default: the token\'s', size: 24 })),
      field('Environment', select('environment', [['', '— none: layers below —']].concat(envList.map((e) => [e.name, e.name + ' (' + e.project + ')'])))),
      field('Base layer', input('base', { list: 'new-bases', placeholder: 'NAME:VERSION', size: 30 }), 'without an environment'),
      field('Workspace layer', input('workspace', { list: 'new-layers', placeholder: 'NAME:VERSION', size: 30 })),
      field('Toolkits', input('toolkits', { list: 'new-layers', placeholder: 'NAME:VERSION, …', size: 40 })),
      datalist('new-bases', refs('base')), datalist('new-layers', refs('')), datalist('new-images', refs('vm-image'))),
    h('fieldset', {}, h('legend', {}, 'Where'),
      field('Tier', select('tier', [['', 'container (default)'], ['container', 'container'], ['microvm', 'microvm'], ['vm', 'vm']])),
      field('Runtime', select('runtime', [['', 'runc (default)'], ['runc', 'runc'], ['gvisor', 'gvisor']]), 'container tier'),
      field('Disk image', input('image', { list: 'new-images', placeholder: 'NAME:VERSION', size: 30 }), 'vm tier: a vm-image layer')),
    h('fieldset', {}, h('legend', {}, 'Limits (empty: the defaults)'),
      field('CPUs', input('cpus', { type: 'number', min: '0.1', step: '0.1', size: 6 })),
      field('Memory (MiB)', input('memory_mib', { type: 'number', min: '1', size: 8 })),
      field('Disk (MiB)', input('disk_mib', { type: 'number', min: '1', size: 8 })),
      field('Processes', input('pids', { type: 'number', min: '1', size: 8 })),
      field('Open files', input('open_files', { type: 'number', min: '1', size: 8 }))),
    h('fieldset', {}, h('legend', {}, 'Network'),
      field('Mode', select('network', [['', 'none, or allowlist with rules'], ['none', 'none (loopback only)'], ['allowlist', 'allowlist'], ['open', 'open']])),
      field('Allow', area('allow', { placeholder: 'one rule a line: pypi.org, *.github.com:443, 10.0.0.5:8080/tcp, a service name' })),
      field('Deny', area('deny', { placeholder: 'one rule a line (wins over allow)' }))),
    h('fieldset', {}, h('legend', {}, 'Lifetime and labels'),
      field('TTL', input('ttl', { placeholder: 'e.g. 30m (default: the server\'s)', size: 20 })),
      field('Idle TTL', input('idle_ttl', { placeholder: 'e.g. 10m', size: 12 })),
      field('Pause when idle for', input('auto_pause_after', { placeholder: 'e.g. 5m', size: 12 })),
      field('Labels', area('labels', { placeholder: 'KEY=VALUE, one a line' })),
      field('Environment variables', area('env', { placeholder: 'KEY=VALUE, one a line' }))),
    h('button', { type: 'submit', id: 'new-create' }, 'Create sandbox'), status);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const values = {};
    for (const el of form.elements) if (el.name) values[el.name] = el.value;
    let req;
    try {
      req = createRequest(values);
    } catch (err) {
      replace(status, errorBox(err));
      return;
    }
    form.dataset.request = JSON.stringify(req);
    replace(status, h('span', { class: 'muted' }, 'creating…'));
    const button = document.getElementById('new-create');
    button.disabled = true; // one create per click, however often it is clicked
    try {
      const sb = await api.call('/v1/sandboxes', { method: 'POST', json: req });
      location.hash = '#/sandboxes/' + encodeURIComponent(sb.id);
    } catch (err) {
      replace(status, errorBox(err));
    } finally {
      button.disabled = false;
    }
  });
  replace(root, h('h1', {}, h('a', { href: '#/sandboxes' }, 'Sandboxes'), ' / new'),
    envs.status === 'rejected' ? errorBox(envs.reason) : null, form);
}
