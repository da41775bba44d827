// Tokens the signed-in token may see (GET /v1/tokens), with revocation, and a form to mint one
// (POST /v1/tokens): for the signed-in principal, or for a new agent principal granted the role
// in the project. The new token is shown once; the server keeps only its hash.
import { h, replace, table, when, errorBox } from '../dom.js';
import * as api from '../api.js';

export async function render(root, _params, me) {
  const list = await api.call('/v1/tokens');
  const status = h('div', { id: 'token-status' });
  const project = h('input', { id: 'token-project', placeholder: 'project (default: this token\'s)', size: 24 });
  const role = h('select', { id: 'token-role' }, ['viewer', 'user', 'admin', 'owner'].map((r) => h('option', { value: r }, r)));
  role.value = 'user';
  const agent = h('input', { id: 'token-agent', placeholder: 'new agent\'s name (empty: for me)', size: 28 });
  const ttl = h('input', { id: 'token-ttl', placeholder: 'TTL, e.g. 24h (empty: until revoked)', size: 28 });
  const form = h('form', {
    id: 'token-mint',
    class: 'filters',
    onsubmit: async (e) => {
      e.preventDefault();
      const req = { project: project.value.trim() || (me && me.token.project) || '/', role: role.value };
      if (ttl.value.trim()) req.ttl = ttl.value.trim();
      if (agent.value.trim()) { req.kind = 'agent'; req.name = agent.value.trim(); }
      try {
        const t = await api.call('/v1/tokens', { method: 'POST', json: req });
        await render(root, _params, me);
        replace(document.getElementById('token-status'), h('div', { class: 'ok', id: 'token-new' },
          'Minted ' + t.id + ' for ' + t.principal + ' on ' + t.project + '. The token, shown this once: ', h('span', { class: 'mono' }, t.token)));
      } catch (err) {
        replace(status, errorBox(err));
      }
    },
  }, project, role, agent, ttl, h('button', { type: 'submit', id: 'token-mint-button' }, 'Mint a token'));
  replace(root, h('h1', {}, 'Tokens'), table([
    { title: 'ID', get: (t) => h('span', { class: 'mono' }, t.id + (me && t.id === me.token.id ? ' (this one)' : '')) },
    { title: 'Principal', get: (t) => t.principal },
    { title: 'Project', get: (t) => t.project },
    { title: 'Role / permissions', get: (t) => t.role || (t.permissions || []).join(', ') },
    { title: 'Created', get: (t) => when(t.created_at) },
    { title: 'Expires', get: (t) => t.expires_at ? when(t.expires_at) : 'never' },
    { title: 'Revoked', get: (t) => t.revoked_at ? when(t.revoked_at) : h('button', {
      onclick: async () => {
        if (!confirm('Revoke token ' + t.id + '?')) return;
        try { await api.call('/v1/tokens/' + encodeURIComponent(t.id), { method: 'DELETE' }); render(root, _params, me); } catch (e) { alert(e.message); }
      },
    }, 'Revoke') },
  ], list || [], { id: 'tokens' }), h('h2', {}, 'Mint a token'), form, status);
}
