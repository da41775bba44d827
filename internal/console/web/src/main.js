// The console's entry point: sign-in, the navigation, and a router on the URL's fragment
// (#/sandboxes, #/sandboxes/ID, ...). Each page is a module whose render(root, params)
// fills root and may return a function that stops what it started (streams, timers).
import './style.css';
import '@xterm/xterm/css/xterm.css';
import { h, replace, errorBox } from './dom.js';
import * as api from './api.js';
import * as sandboxes from './pages/sandboxes.js';
import * as sandbox from './pages/sandbox.js';
import * as projects from './pages/projects.js';
import * as tokens from './pages/tokens.js';
import * as layers from './pages/layers.js';
import * as fncall from './pages/fncall.js';
import * as nodes from './pages/nodes.js';
import * as report from './pages/report.js';
import * as create from './pages/create.js';
import * as webhooks from './pages/webhooks.js';

const routes = [
  { re: /^#\/new$/, page: create },
  { re: /^#\/sandboxes\/([^/]+)$/, page: sandbox },
  { re: /^#\/sandboxes$/, page: sandboxes, nav: 'Sandboxes', path: '#/sandboxes' },
  { re: /^#\/projects$/, page: projects, nav: 'Projects', path: '#/projects' },
  { re: /^#\/tokens$/, page: tokens, nav: 'Tokens', path: '#/tokens' },
  { re: /^#\/layers$/, page: layers, nav: 'Layers & environments', path: '#/layers' },
  { re: /^#\/fncall$/, page: fncall, nav: 'Fncall pools', path: '#/fncall' },
  { re: /^#\/nodes$/, page: nodes, nav: 'Nodes', path: '#/nodes' },
  { re: /^#\/webhooks$/, page: webhooks, nav: 'Webhooks', path: '#/webhooks' },
  { re: /^#\/report$/, page: report, nav: 'Report', path: '#/report' },
];

const app = document.getElementById('app');
let stop = null;
let me = null;

function signInPage(message) {
  const input = h('input', { type: 'password', id: 'token', autocomplete: 'off', placeholder: 'corral_…', size: 50 });
  const form = h('form', {
    id: 'signin',
    onsubmit: (e) => {
      e.preventDefault();
      api.setToken(input.value.trim());
      start();
    },
  }, h('h1', {}, 'Corral'), h('p', {}, 'Sign in with an API token. It is kept in this tab only and sent with each API call.'),
  input, ' ', h('button', { type: 'submit', id: 'signin-button' }, 'Sign in'), message ? errorBox(message) : null);
  replace(app, form);
  input.focus();
}

function shell() {
  const nav = h('nav', {}, h('strong', {}, 'Corral'),
    routes.filter((r) => r.nav).map((r) => h('a', { href: r.path }, r.nav)),
    h('span', { class: 'who', id: 'whoami' }, me.principal.name + ' @ ' + (me.token.project || '/')),
    h('button', { id: 'signout', onclick: () => { api.signOut(); location.hash = ''; signInPage(); } }, 'Sign out'));
  const main = h('main', { id: 'page' });
  replace(app, nav, main);
  return main;
}

async function route() {
  if (stop) { stop(); stop = null; }
  if (!location.hash || location.hash === '#/' || location.hash === '#') {
    history.replaceState(null, '', '#/sandboxes');
  }
  const main = document.getElementById('page') || shell();
  for (const a of document.querySelectorAll('nav a')) a.classList.toggle('active', location.hash.startsWith(a.getAttribute('href')));
  for (const r of routes) {
    const m = r.re.exec(location.hash);
    if (!m) continue;
    replace(main);
    try {
      // Only a function stops anything: a page that returned something else (replace's element)
      // once made the next route throw before it drew, leaving the old page up.
      const s = await r.page.render(main, m.slice(1).map(decodeURIComponent), me);
      stop = typeof s === 'function' ? s : null;
    } catch (e) {
      replace(main, errorBox(e));
    }
    return;
  }
  replace(main, errorBox('No such page: ' + location.hash));
}

async function start() {
  api.takeTokenFromURL();
  if (!api.token()) return signInPage();
  try {
    me = await api.call('/v1/whoami');
  } catch (e) {
    api.signOut();
    return signInPage(e);
  }
  shell();
  window.onhashchange = route;
  route();
}

window.addEventListener('corral:unauthorized', () => { api.signOut(); signInPage('The token was refused (expired or revoked?): sign in again.'); });
start();
