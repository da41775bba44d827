// Tokens the signed-in token may see (GET /v1/tokens), with revocation.
import { h, replace, table, when } from '../dom.js';
import * as api from '../api.js';

export async function render(root, _params, me) {
  const list = await api.call('/v1/tokens');
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
  ], list || [], { id: 'tokens' }));
}
