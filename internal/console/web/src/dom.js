// DOM helpers. Every string from the API reaches the page through h() as a text node or an
// attribute set with setAttribute, never as HTML: there is no innerHTML in the console's sources
// (TestNoHTMLSinks), so a sandbox label such as <img onerror=...> shows as the text it is.

// h builds an element: attrs sets attributes (on* keys add event listeners, class sets the
// class), children are nodes or strings (text), arrays of them, or null/false (skipped).
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'href') el.setAttribute('href', safeHref(v));
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

// safeHref keeps links inside the console (#/...) or to same-origin API paths (/v1/...).
function safeHref(v) {
  const s = String(v);
  return s.startsWith('#') || s.startsWith('/') && !s.startsWith('//') ? s : '#';
}

// replace empties el and appends children.
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export function bytes(n) {
  if (n === null || n === undefined) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let v = Number(n);
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? v.toFixed(0) : v.toFixed(1)) + ' ' + units[i];
}

export function when(t) {
  if (!t || t.startsWith('0001-')) return '—';
  const d = new Date(t);
  const s = Math.round((Date.now() - d.getTime()) / 1000);
  const abs = Math.abs(s);
  const rel = abs < 90 ? abs + 's' : abs < 5400 ? Math.round(abs / 60) + 'm' : abs < 129600 ? Math.round(abs / 3600) + 'h' : Math.round(abs / 86400) + 'd';
  return s >= 0 ? rel + ' ago' : 'in ' + rel;
}

export function secs(v) {
  if (v === null || v === undefined) return '—';
  return v < 1 ? (v * 1000).toFixed(0) + ' ms' : v.toFixed(2) + ' s';
}

// table renders rows (objects) with columns [{title, get(row) -> node|string}].
export function table(cols, rows, attrs) {
  return h('table', attrs || {},
    h('thead', {}, h('tr', {}, cols.map((c) => h('th', {}, c.title)))),
    h('tbody', {}, rows.map((r) => h('tr', {}, cols.map((c) => h('td', {}, c.get(r)))))));
}

export function errorBox(err) {
  return h('div', { class: 'error', role: 'alert' }, String(err && err.message ? err.message : err));
}

export function labels(m) {
  return Object.entries(m || {}).map(([k, v]) => h('span', { class: 'label' }, k + '=' + v));
}

export function section(title, ...children) {
  return h('section', {}, h('h2', {}, title), children);
}
