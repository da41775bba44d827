// The files tab: browse a sandbox's directories, download a file, upload files into the
// directory shown. Downloads go through fetch (they need the Authorization header), then a blob.
import { h, replace, table, bytes, when, errorBox } from '../dom.js';
import * as api from '../api.js';

export async function render(root, sb) {
  let dir = sb.cwd || '/';
  const where = h('input', { id: 'files-path', size: 50, 'aria-label': 'directory' });
  const upload = h('input', { type: 'file', id: 'files-upload', multiple: true });
  const status = h('div', { id: 'files-status', class: 'muted' });
  const list = h('div', { id: 'files' });
  replace(root,
    h('form', { class: 'filters', onsubmit: (e) => { e.preventDefault(); open(where.value.trim() || '/'); } },
      where, h('button', { type: 'submit', id: 'files-open' }, 'Open'), h('button', { type: 'button', onclick: () => open(parent(dir)) }, 'Up'),
      h('label', {}, ' Upload: ', upload)),
    status, list);

  upload.addEventListener('change', async () => {
    for (const f of upload.files) {
      const path = join(dir, f.name);
      try {
        await api.call(api.sandboxPath(sb.id, 'files'), { method: 'PUT', query: { path }, body: f });
        status.textContent = 'uploaded ' + path + ' (' + bytes(f.size) + ')';
      } catch (e) {
        status.textContent = 'upload ' + path + ': ' + e.message;
      }
    }
    upload.value = '';
    open(dir);
  });

  async function download(f) {
    try {
      const resp = await api.call(api.sandboxPath(sb.id, 'files'), { query: { path: f.path }, raw: true });
      const url = URL.createObjectURL(await resp.blob());
      const a = h('a', { download: f.name });
      a.href = url; // a blob: URL of our own making, set as a property (h() only takes #/ and / links)
      document.body.appendChild(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
      status.textContent = 'downloaded ' + f.path;
    } catch (e) {
      status.textContent = 'download ' + f.path + ': ' + e.message;
    }
  }

  async function remove(f) {
    if (!confirm('Delete ' + f.path + '?')) return;
    try {
      await api.call(api.sandboxPath(sb.id, 'files'), { method: 'DELETE', query: { path: f.path, recursive: String(f.is_dir) } });
      open(dir);
    } catch (e) { status.textContent = e.message; }
  }

  async function open(d) {
    try {
      const out = await api.call(api.sandboxPath(sb.id, 'files', 'list'), { query: { path: d } });
      const entries = (out && out.files) || []; // {"files": [FileInfo...]}
      dir = d;
      where.value = d;
      list.dataset.dir = d;
      entries.sort((a, b) => (b.is_dir - a.is_dir) || a.name.localeCompare(b.name));
      replace(list, table([
        { title: 'Name', get: (f) => f.is_dir ? h('a', { href: '#', onclick: (e) => { e.preventDefault(); open(f.path); } }, f.name + '/') : h('span', { class: 'mono' }, f.name + (f.link ? ' → ' + f.link : '')) },
        { title: 'Size', get: (f) => f.is_dir ? '' : bytes(f.size) },
        { title: 'Modified', get: (f) => when(f.mod_time) },
        { title: '', get: (f) => [f.is_dir ? null : h('button', { 'data-download': f.name, onclick: () => download(f) }, 'Download'), ' ', h('button', { onclick: () => remove(f) }, 'Delete')] },
      ], entries, { id: 'file-table' }));
    } catch (e) {
      replace(list, errorBox(e));
    }
  }
  await open(dir);
}

function join(d, name) { return (d.endsWith('/') ? d : d + '/') + name; }
function parent(d) { const p = d.replace(/\/+$/, '').replace(/\/[^/]*$/, ''); return p || '/'; }
