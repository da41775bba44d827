// The terminal tab: xterm.js on a command in the sandbox, either a new one (started on a TTY
// with POST .../commands) or a running one (attached). A browser cannot stream a request body
// while it reads the response, so where the CLI uses one full-duplex exec, the console reads the
// output with GET .../commands/{cid}/output?follow=true and sends keystrokes with
// POST .../commands/{cid}/stdin, in order, batched while one is in flight.
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import { h, replace, table, errorBox, when } from '../dom.js';
import * as api from '../api.js';

export async function render(root, sb) {
  const cmd = h('input', { id: 'term-command', value: '/bin/sh', size: 40, 'aria-label': 'command' });
  const status = h('span', { id: 'term-status', class: 'muted' });
  const box = h('div', { id: 'terminal' });
  const running = h('div', { id: 'commands' });
  replace(root,
    h('form', { class: 'filters', onsubmit: (e) => { e.preventDefault(); start(); } },
      cmd, h('button', { type: 'submit', id: 'term-run' }, 'Run on a terminal'), status),
    box, h('h3', {}, 'Commands'), running);

  const term = new Terminal({ convertEol: false, fontSize: 13, scrollback: 5000 });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(box);
  fit.fit();
  let session = null;

  function stopSession() {
    if (session) { session.abort.abort(); session = null; }
  }

  async function attach(cid, withStdin) {
    stopSession();
    const s = { cid, abort: new AbortController(), queue: '', sending: false };
    session = s;
    status.textContent = 'attached to ' + cid;
    box.dataset.command = cid;
    try {
      await api.lines(api.sandboxPath(sb.id, 'commands', cid, 'output'), { offset: '0', follow: 'true' }, (ev) => {
        if ((ev.type === 'stdout' || ev.type === 'stderr') && ev.data) term.write(api.b64(ev.data));
        else if (ev.type === 'truncated') term.write('\r\n[' + ev.dropped + ' bytes dropped]\r\n');
        else if (ev.type === 'exit') {
          const x = ev.exit || {};
          status.textContent = cid + ' exited' + (x.signal ? ' on ' + x.signal : ' with ' + x.code) + (x.error ? ': ' + x.error : '');
        } else if (ev.type === 'error') status.textContent = 'output stream failed: ' + ev.data;
      }, s.abort.signal);
    } catch (e) {
      if (!s.abort.signal.aborted) status.textContent = e.message;
    }
    if (session === s) { session = null; listCommands(); }
    return withStdin;
  }

  async function flush(s) {
    if (s.sending || !s.queue) return;
    s.sending = true;
    while (s.queue && session === s) {
      const data = s.queue;
      s.queue = '';
      try {
        await api.call(api.sandboxPath(sb.id, 'commands', s.cid, 'stdin'), { method: 'POST', body: new TextEncoder().encode(data), query: { eof: 'false' } });
      } catch (e) {
        status.textContent = 'stdin: ' + e.message;
        break;
      }
    }
    s.sending = false;
  }
  term.onData((d) => { if (session) { session.queue += d; flush(session); } });
  term.onResize(({ rows, cols }) => {
    if (session) api.call(api.sandboxPath(sb.id, 'commands', session.cid, 'resize'), { method: 'POST', json: { rows, cols } }).catch(() => {});
  });
  const onWindowResize = () => fit.fit();
  window.addEventListener('resize', onWindowResize);

  async function start() {
    try {
      const c = await api.call(api.sandboxPath(sb.id, 'commands'), {
        method: 'POST',
        json: { argv: [cmd.value], shell: true, tty: true, open_stdin: true, rows: term.rows, cols: term.cols },
      });
      term.reset();
      term.focus();
      attach(c.id, true);
      listCommands();
    } catch (e) {
      status.textContent = e.message;
    }
  }

  async function listCommands() {
    try {
      const out = await api.call(api.sandboxPath(sb.id, 'commands'));
      const list = (out.commands || []).slice().reverse().slice(0, 20);
      replace(running, list.length === 0 ? h('span', { class: 'muted' }, 'none yet') : table([
        { title: 'ID', get: (c) => h('span', { class: 'mono' }, c.id) },
        { title: 'Command', get: (c) => h('span', { class: 'mono' }, (c.argv || []).join(' ')) },
        { title: 'State', get: (c) => c.state || (c.exit ? 'exited' : 'running') },
        { title: 'Started', get: (c) => when(c.started_at) },
        { title: '', get: (c) => h('button', { onclick: () => { term.reset(); attach(c.id, true); } }, 'Attach') },
      ], list));
    } catch (e) {
      replace(running, errorBox(e));
    }
  }
  listCommands();
  // The terminal is not disposed: its element leaves the page with the tab, and disposing it
  // while the output stream unwinds wedged the page in Chromium.
  return () => { stopSession(); window.removeEventListener('resize', onWindowResize); };
}
