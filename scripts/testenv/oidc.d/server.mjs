// Keycloak-compatible OIDC test peer for the integration tests (started by scripts/testenv/oidc).
//
// Keycloak itself is not installable here (no Docker, no release downloads), so this serves panva's
// oidc-provider (an OpenID Certified OP library, npm) for one realm at Keycloak's URL layout, with
// the claims Keycloak puts in its tokens. It is a test peer, not part of spotctl.
//
//   GET  /realms/REALM                                        realm info incl. base64 DER `public_key`
//   GET  /realms/REALM/.well-known/openid-configuration       discovery (oidc-provider)
//   POST /realms/REALM/protocol/openid-connect/token          client_credentials, device_code, refresh_token,
//                                                             password (clients with directAccessGrantsEnabled)
//   POST /realms/REALM/protocol/openid-connect/auth/device    device authorization (+ `interval`, as Keycloak)
//   GET  /realms/REALM/protocol/openid-connect/certs          JWKS (RS256, with kid)
//   *    /realms/REALM/protocol/openid-connect/userinfo       userinfo for our JWT access tokens
//   POST /realms/REALM/protocol/openid-connect/token/introspect  Keycloak-style introspection (confidential clients)
//   POST /realms/REALM/protocol/openid-connect/revoke         RFC 7009 revocation (oidc-provider)
//   POST /realms/REALM/protocol/openid-connect/logout         refresh_token -> 204, ends the session (Keycloak style)
//   TEST ONLY (no Keycloak counterpart; never expose this peer beyond loopback):
//   POST /realms/REALM/test-support/device/approve  {user_code, username, password, deny?}
//   POST /realms/REALM/test-support/device/expire   {user_code}   the device code expires now
//   POST /realms/REALM/test-support/rotate-keys     new RS256 signing key + kid -> {"kid": NEW}
//
// Differences from Keycloak that the wrapper fixes: tokens carry realm_access/resource_access roles,
// preferred_username, azp, typ "Bearer", sid/session_state; service-account tokens have the service
// account user's id as `sub`; the JWT header `typ` is "JWT"; `aud` comes from the client's
// oidc-audience-mapper protocol mappers; client_secret_basic and client_secret_post are both accepted;
// device polling faster than the realm's interval answers `slow_down` (oidc-provider never does).
//
// Usage: node server.mjs REALM_JSON --host 127.0.0.1 --port 18080
// REALM_JSON is a subset of Keycloak's realm export format (see realm.json next to this file).
import http from 'node:http';
import fs from 'node:fs';
import crypto from 'node:crypto';
import querystring from 'node:querystring';
import Provider, { errors } from 'oidc-provider';
import * as jose from 'jose';

const args = process.argv.slice(2);
const opt = (name, dflt) => { const i = args.indexOf(`--${name}`); return i >= 0 ? args[i + 1] : dflt; };
const realmPath = args.find((a, i) => !a.startsWith('--') && (i === 0 || !args[i - 1].startsWith('--')));
if (!realmPath) { console.error('usage: node server.mjs REALM_JSON [--host H] [--port P]'); process.exit(2); }
const HOST = opt('host', '127.0.0.1');
const PORT = Number(opt('port', '18080'));
const BASE = `http://${HOST}:${PORT}`;
const R = JSON.parse(fs.readFileSync(realmPath, 'utf8'));
const REALM = R.realm;
const ISSUER = `${BASE}/realms/${REALM}`;
const RESOURCE = `urn:testenv:realm:${REALM}`; // one resource server: every access token is a JWT
const SCOPES = ['openid', 'profile', 'email', 'roles', 'web-origins', 'offline_access', 'acr', 'basic'];
const AT_TTL = R.accessTokenLifespan ?? 300;
const RT_TTL = Math.min(R.ssoSessionIdleTimeout ?? 1800, R.ssoSessionMaxLifespan ?? 36000);
const DEVICE_TTL = R.oauth2DeviceCodeLifespan ?? 600;
const DEVICE_INTERVAL = R.oauth2DevicePollingInterval ?? 5;
const DEVICE_GRANT = 'urn:ietf:params:oauth:grant-type:device_code';
const DEFAULT_ROLES = [`default-roles-${REALM}`, 'offline_access', 'uma_authorization'];

const now = () => Math.floor(Date.now() / 1000);
function uuidFor(s) { // stable UUID-looking ids, like Keycloak's user ids
  const h = crypto.createHash('sha256').update(`${REALM}/${s}`).digest('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-4${h.slice(13, 16)}-a${h.slice(17, 20)}-${h.slice(20, 32)}`;
}

// ------------------------------------------------------------------------------- realm model
const clientsById = new Map((R.clients || []).map((c) => [c.clientId, c]));
const users = new Map(); // username -> user
for (const u of R.users || []) {
  users.set(u.username, {
    ...u,
    id: u.id || uuidFor(u.username),
    password: (u.credentials || []).find((c) => c.type === 'password')?.value,
  });
}
const usersById = new Map([...users.values()].map((u) => [u.id, u]));
const serviceAccountOf = (clientId) => [...users.values()].find((u) => u.serviceAccountClientId === clientId);

function audienceFor(clientId) { // Keycloak's "Audience" protocol mapper (oidc-audience-mapper)
  const c = clientsById.get(clientId);
  const auds = (c?.protocolMappers || [])
    .filter((m) => m.protocolMapper === 'oidc-audience-mapper' && m.config?.['access.token.claim'] !== 'false')
    .map((m) => m.config?.['included.client.audience'] || m.config?.['included.custom.audience'])
    .filter(Boolean);
  const uniq = [...new Set(auds)];
  if (uniq.length === 0) return 'account';
  return uniq.length === 1 ? uniq[0] : uniq;
}
function roleClaims(user) {
  const realmRoles = [...new Set([...(user.realmRoles || []), ...DEFAULT_ROLES])];
  const resource_access = {};
  for (const [cid, roles] of Object.entries(user.clientRoles || {})) if (roles.length) resource_access[cid] = { roles };
  return { realm_access: { roles: realmRoles }, ...(Object.keys(resource_access).length ? { resource_access } : {}) };
}
function profileClaims(user) {
  const name = [user.firstName, user.lastName].filter(Boolean).join(' ');
  return {
    sub: user.id, preferred_username: user.username, email_verified: !!user.emailVerified,
    ...(name ? { name } : {}), ...(user.firstName ? { given_name: user.firstName } : {}),
    ...(user.lastName ? { family_name: user.lastName } : {}), ...(user.email ? { email: user.email } : {}),
  };
}
function checkUser(username, password) {
  const u = users.get(username);
  if (!u || u.serviceAccountClientId || u.enabled === false || u.password === undefined || u.password !== password) return null;
  return u;
}

function providerClients() {
  return (R.clients || []).filter((c) => c.enabled !== false).map((c) => {
    const grants = new Set();
    if (c.serviceAccountsEnabled) grants.add('client_credentials');
    if (c.attributes?.['oauth2.device.authorization.grant.enabled'] === 'true') grants.add(DEVICE_GRANT);
    if (c.directAccessGrantsEnabled) grants.add('password');
    if ((grants.has(DEVICE_GRANT) || grants.has('password')) && c.attributes?.['use.refresh.tokens'] !== 'false') {
      grants.add('refresh_token');
    }
    return {
      client_id: c.clientId,
      // confidential clients authenticate with client_secret_basic; client_secret_post is rewritten to it below
      ...(c.publicClient ? { token_endpoint_auth_method: 'none' } : { client_secret: c.secret, token_endpoint_auth_method: 'client_secret_basic' }),
      grant_types: [...grants],
      response_types: [],
      redirect_uris: [],
    };
  });
}

// ------------------------------------------------------------------------------- storage
// In-memory adapter shared by every Provider instance (key rotation builds a new one), without the
// 1000-entry LRU of oidc-provider's quick-start adapter (a long test run must not lose its grants).
const store = new Map(); // key -> {payload, expiresAt}
const index = new Map(); // "grant:ID" -> Set(keys), "userCode:CODE" -> id
setInterval(() => { const t = now(); for (const [k, v] of store) if (v.expiresAt && v.expiresAt < t) store.delete(k); }, 60_000).unref();
class Adapter {
  constructor(model) { this.model = model; }
  key(id) { return `${this.model}:${id}`; }
  async upsert(id, payload, expiresIn) {
    const key = this.key(id);
    store.set(key, { payload, expiresAt: expiresIn ? now() + expiresIn : undefined });
    if (payload.grantId) {
      const g = `grant:${payload.grantId}`;
      if (!index.has(g)) index.set(g, new Set());
      index.get(g).add(key);
    }
    if (payload.userCode) index.set(`userCode:${payload.userCode}`, id);
    if (payload.uid && this.model === 'Session') index.set(`sessionUid:${payload.uid}`, id);
  }
  async find(id) {
    const e = store.get(this.key(id));
    if (!e) return undefined;
    if (e.expiresAt && e.expiresAt < now()) { store.delete(this.key(id)); return undefined; }
    return e.payload;
  }
  async findByUserCode(userCode) { const id = index.get(`userCode:${userCode}`); return id && this.find(id); }
  async findByUid(uid) { const id = index.get(`sessionUid:${uid}`); return id && this.find(id); }
  async consume(id) { const e = store.get(this.key(id)); if (e) e.payload.consumed = now(); }
  async destroy(id) { store.delete(this.key(id)); }
  async revokeByGrantId(grantId) {
    const g = `grant:${grantId}`;
    for (const k of index.get(g) || []) store.delete(k);
    index.delete(g);
  }
}

// ------------------------------------------------------------------------------- keys
const keys = []; // private JWKs, newest first (new tokens are signed with keys[0])
function newKey() {
  const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
  const jwk = { ...privateKey.export({ format: 'jwk' }), kid: crypto.randomBytes(16).toString('base64url'), alg: 'RS256', use: 'sig' };
  keys.unshift(jwk);
  return jwk;
}
const publicJwk = ({ kty, n, e, kid, alg, use }) => ({ kty, n, e, kid, alg, use });
let localJwks;
function publicKeyB64() {
  return crypto.createPublicKey({ key: publicJwk(keys[0]), format: 'jwk' }).export({ type: 'spki', format: 'der' }).toString('base64');
}

// ------------------------------------------------------------------------------- provider
const resourceServerInfo = {
  scope: SCOPES.join(' '), audience: 'account', accessTokenTTL: AT_TTL, accessTokenFormat: 'jwt', jwt: { sign: { alg: 'RS256' } },
};
const cookieKeys = [crypto.randomBytes(32).toString('base64url')];

function buildProvider() {
  const provider = new Provider(ISSUER, {
    adapter: Adapter,
    clients: providerClients(),
    jwks: { keys: keys.slice() },
    cookies: { keys: cookieKeys },
    scopes: SCOPES,
    claims: { openid: ['sub'], profile: ['name', 'given_name', 'family_name', 'preferred_username'], email: ['email', 'email_verified'] },
    clientAuthMethods: ['client_secret_basic', 'none'],
    findAccount: async (ctx, sub) => {
      const u = usersById.get(sub);
      return u && { accountId: sub, claims: async () => ({ ...profileClaims(u) }) };
    },
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      deviceFlow: { enabled: true },
      introspection: { enabled: false }, // ours below (oidc-provider does not introspect JWT access tokens)
      revocation: { enabled: true },
      userinfo: { enabled: false }, // ours below
      rpInitiatedLogout: { enabled: false }, // ours below
      pushedAuthorizationRequests: { enabled: false },
      resourceIndicators: {
        enabled: true,
        defaultResource: async () => RESOURCE,
        useGrantedResource: async () => true,
        getResourceServerInfo: async (ctx, indicator) => {
          if (indicator !== RESOURCE) throw new errors.InvalidTarget();
          return resourceServerInfo;
        },
      },
    },
    formats: {
      customizers: {
        // Keycloak's access token claims
        async jwt(ctx, token, jwt) {
          const cid = token.clientId;
          const p = jwt.payload;
          jwt.header = { typ: 'JWT' };
          let user = token.accountId ? usersById.get(token.accountId) : undefined;
          if (!user && token.kind === 'ClientCredentials') user = serviceAccountOf(cid);
          Object.assign(p, { typ: 'Bearer', azp: cid, acr: '1', aud: audienceFor(cid) });
          if (token.grantId) Object.assign(p, { sid: token.grantId, session_state: token.grantId });
          if (user) Object.assign(p, roleClaims(user), profileClaims(user));
          if (!user?.serviceAccountClientId) delete p.client_id; // Keycloak names the client in azp only
        },
      },
    },
    issueRefreshToken: async (ctx, client) => client.grantTypeAllowed('refresh_token'),
    rotateRefreshToken: false,
    ttl: {
      AccessToken: AT_TTL, ClientCredentials: AT_TTL, IdToken: AT_TTL, RefreshToken: RT_TTL,
      DeviceCode: DEVICE_TTL, Grant: RT_TTL, Session: RT_TTL, Interaction: 600,
    },
    routes: {
      authorization: '/protocol/openid-connect/auth',
      token: '/protocol/openid-connect/token',
      jwks: '/protocol/openid-connect/certs',
      userinfo: '/protocol/openid-connect/userinfo',
      introspection: '/protocol/openid-connect/token/introspect',
      revocation: '/protocol/openid-connect/revoke',
      device_authorization: '/protocol/openid-connect/auth/device',
      code_verification: '/device',
      end_session: '/protocol/openid-connect/logout',
    },
    pkce: { required: () => false },
    conformIdTokenClaims: false,
  });
  provider.proxy = true;

  // Keycloak's "Direct access grants" (password grant): oidc-provider has no handler for it (OAuth 2.1
  // dropped it); registered with oidc-provider's own models. Only for clients with directAccessGrantsEnabled.
  provider.registerGrantType('password', async (ctx) => {
    const { username, password } = ctx.oidc.params;
    const user = checkUser(username, password);
    if (!user) throw new errors.InvalidGrant('Invalid user credentials');
    const client = ctx.oidc.client;
    const requested = new Set((ctx.oidc.params.scope || 'openid').split(' ').filter(Boolean));
    requested.add('profile'); requested.add('email'); // Keycloak's default client scopes
    const scope = [...requested].filter((s) => SCOPES.includes(s)).join(' ');
    const grant = new provider.Grant({ accountId: user.id, clientId: client.clientId });
    grant.addOIDCScope(scope);
    grant.addResourceScope(RESOURCE, scope);
    const grantId = await grant.save();
    const authTime = now();
    const at = new provider.AccessToken({ accountId: user.id, client, grantId, gty: 'password', scope });
    at.resourceServer = new provider.ResourceServer(RESOURCE, resourceServerInfo);
    const accessToken = await at.save();
    let refreshToken;
    if (client.grantTypeAllowed('refresh_token')) {
      refreshToken = await new provider.RefreshToken({ accountId: user.id, client, grantId, gty: 'password', scope,
        resource: RESOURCE, rotations: 0, authTime, expiresWithSession: false }).save();
    }
    let idToken;
    if (requested.has('openid')) {
      const it = new provider.IdToken({ ...profileClaims(user), auth_time: authTime, acr: '1' }, { ctx });
      it.scope = scope;
      it.set('sid', grantId);
      idToken = await it.issue({ use: 'idtoken' });
    }
    ctx.body = {
      access_token: accessToken, expires_in: at.expiration, token_type: 'Bearer',
      ...(refreshToken ? { refresh_token: refreshToken } : {}), ...(idToken ? { id_token: idToken } : {}),
      session_state: grantId, scope,
    };
  }, ['username', 'password', 'scope'], []);

  return provider;
}

let provider;
let callback;
function install() {
  provider = buildProvider();
  callback = provider.callback();
  localJwks = jose.createLocalJWKSet({ keys: keys.map(publicJwk) });
}

async function verifyAccessToken(token) {
  const { payload } = await jose.jwtVerify(token, localJwks, { issuer: ISSUER });
  if (payload.sid && !(await provider.Grant.find(payload.sid))) throw new Error('session ended');
  return payload;
}

// ------------------------------------------------------------------------------- http
function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c)); req.on('end', () => resolve(Buffer.concat(chunks).toString())); req.on('error', reject);
  });
}
function send(res, code, obj) {
  const body = obj === undefined ? '' : JSON.stringify(obj);
  res.writeHead(code, { 'content-type': 'application/json', 'cache-control': 'no-store' });
  res.end(body);
}
const oauthError = (res, code, error, description) => send(res, code, { error, error_description: description });
// client credentials from Basic auth or the form (Keycloak accepts both); null when they do not match
function clientFrom(req, form) {
  let id = form.client_id; let secret = form.client_secret;
  const auth = req.headers.authorization || '';
  if (/^basic /i.test(auth)) {
    const raw = Buffer.from(auth.slice(6), 'base64').toString();
    const i = raw.indexOf(':');
    id = decodeURIComponent(raw.slice(0, i).replace(/\+/g, ' ')); secret = decodeURIComponent(raw.slice(i + 1).replace(/\+/g, ' '));
  }
  const c = clientsById.get(id);
  if (!c || c.enabled === false || (!c.publicClient && c.secret !== secret)) return null;
  return c;
}
function patchJson(res, fn) { // rewrite oidc-provider's JSON answer before it goes out
  const end = res.end.bind(res);
  res.end = (chunk, ...rest) => {
    try {
      if (chunk && (res.getHeader('content-type') || '').toString().includes('json')) {
        const j = JSON.parse(chunk.toString());
        if (fn(j, res.statusCode) !== false) {
          chunk = JSON.stringify(j);
          res.setHeader('content-length', Buffer.byteLength(chunk));
        }
      }
    } catch { /* not JSON: pass through */ }
    return end(chunk, ...rest);
  };
}

const lastPoll = new Map(); // device_code -> ms of the last poll that was not answered slow_down

async function handle(req, res) {
  const url = new URL(req.url, BASE);
  if (url.pathname === '/health' || url.pathname === '/health/ready' || url.pathname === '/health/live') {
    return send(res, 200, { status: 'UP' });
  }
  const m = url.pathname.match(/^\/realms\/([^/]+)(\/.*)?$/);
  if (!m || m[1] !== REALM) return send(res, 404, { error: 'Realm does not exist' });
  const rest = m[2] || '';
  const isForm = (req.headers['content-type'] || '').includes('application/x-www-form-urlencoded');

  if ((rest === '' || rest === '/') && req.method === 'GET') {
    return send(res, 200, { realm: REALM, public_key: publicKeyB64(), 'token-service': `${ISSUER}/protocol/openid-connect`,
      'account-service': `${ISSUER}/account`, 'tokens-not-before': 0 });
  }

  // ---- TEST ONLY endpoints: no Keycloak counterpart, they let tests act as the user / the admin
  if (rest.startsWith('/test-support/') && req.method === 'POST') {
    let body;
    try { body = JSON.parse((await readBody(req)) || '{}'); } catch { return send(res, 400, { error: 'invalid JSON' }); }
    if (rest === '/test-support/device/approve' || rest === '/test-support/device/expire') {
      const userCode = String(body.user_code || '').toUpperCase().replace(/[^A-Z0-9]/g, '');
      const code = await provider.DeviceCode.findByUserCode(userCode, { ignoreExpiration: true });
      if (!code) return send(res, 404, { error: 'unknown user_code' });
      if (rest === '/test-support/device/expire') {
        const e = store.get(`DeviceCode:${code.jti}`);
        if (e) e.payload.exp = now() - 1;
        return send(res, 200, { expired: true });
      }
      if (code.isExpired) return send(res, 400, { error: 'expired user_code' });
      if (code.accountId || code.error) return send(res, 409, { error: 'user_code already used' });
      const u = checkUser(body.username, body.password);
      if (!u) return send(res, 401, { error: 'invalid_user_credentials' });
      if (body.deny) {
        code.error = 'access_denied'; code.errorDescription = 'The end user denied the authorization request';
        await code.save();
        return send(res, 200, { denied: true });
      }
      const grant = new provider.Grant({ accountId: u.id, clientId: code.clientId });
      const scope = [...new Set([...(code.scope || 'openid').split(' '), 'profile', 'email'])].filter((s) => SCOPES.includes(s)).join(' ');
      grant.addOIDCScope(scope);
      grant.addResourceScope(RESOURCE, scope);
      code.grantId = await grant.save();
      Object.assign(code, { accountId: u.id, authTime: now(), acr: '1', resource: RESOURCE, scope });
      await code.save();
      return send(res, 200, { approved: true });
    }
    if (rest === '/test-support/rotate-keys') {
      const jwk = newKey();
      install();
      console.log(`rotated signing key: new kid ${jwk.kid} (${keys.length} keys in the JWKS)`);
      return send(res, 200, { kid: jwk.kid });
    }
    return send(res, 404, { error: 'unknown test-support endpoint' });
  }

  if (rest === '/protocol/openid-connect/token/introspect' && req.method === 'POST') {
    const form = querystring.parse(await readBody(req));
    const client = clientFrom(req, form);
    if (!client || client.publicClient) return oauthError(res, 401, 'invalid_client', 'Authentication failed.');
    try {
      const p = await verifyAccessToken(String(form.token || ''));
      const u = usersById.get(p.sub);
      return send(res, 200, { ...p, client_id: p.azp, ...(u ? { username: u.username } : {}), token_type: 'Bearer', active: true });
    } catch { return send(res, 200, { active: false }); }
  }
  if (rest === '/protocol/openid-connect/userinfo' && (req.method === 'GET' || req.method === 'POST')) {
    try {
      const p = await verifyAccessToken((req.headers.authorization || '').replace(/^Bearer\s+/i, ''));
      const u = usersById.get(p.sub);
      if (!u) throw new Error('no user');
      return send(res, 200, profileClaims(u));
    } catch { return oauthError(res, 401, 'invalid_token', 'Token verification failed'); }
  }
  if (rest === '/protocol/openid-connect/logout' && req.method === 'POST' && isForm) {
    const form = querystring.parse(await readBody(req));
    const client = clientFrom(req, form);
    if (!client) return oauthError(res, 401, 'unauthorized_client', 'Invalid client or Invalid client credentials');
    if (!form.refresh_token) return oauthError(res, 400, 'invalid_request', 'Missing parameter: refresh_token');
    const rt = await provider.RefreshToken.find(String(form.refresh_token));
    if (!rt || rt.clientId !== client.clientId) return oauthError(res, 400, 'invalid_grant', 'Invalid refresh token');
    if (rt.grantId) {
      const g = await provider.Grant.find(rt.grantId);
      if (g) await g.destroy();
      await provider.RefreshToken.adapter.revokeByGrantId(rt.grantId);
    }
    await rt.destroy();
    res.writeHead(204); return res.end();
  }

  // ---- everything else: oidc-provider mounted at /realms/REALM
  if (rest === '/.well-known/openid-configuration' && req.method === 'GET') {
    patchJson(res, (j, status) => { // the endpoints served above, as Keycloak's discovery lists them
      if (status !== 200) return false;
      const o = `${ISSUER}/protocol/openid-connect`;
      Object.assign(j, { userinfo_endpoint: `${o}/userinfo`, introspection_endpoint: `${o}/token/introspect`,
        end_session_endpoint: `${o}/logout` });
      j.token_endpoint_auth_methods_supported = [...new Set([...(j.token_endpoint_auth_methods_supported || []), 'client_secret_post'])];
      return true;
    });
  }
  if (req.method === 'POST' && isForm && ['/protocol/openid-connect/token', '/protocol/openid-connect/revoke',
    '/protocol/openid-connect/auth/device'].includes(rest)) {
    const raw = await readBody(req);
    const form = querystring.parse(raw);
    // Keycloak accepts client_secret_post as well as client_secret_basic: hand oidc-provider Basic auth
    if (form.client_secret !== undefined && !req.headers.authorization) {
      const enc = (s) => encodeURIComponent(String(s));
      req.headers.authorization = `Basic ${Buffer.from(`${enc(form.client_id)}:${enc(form.client_secret)}`).toString('base64')}`;
      delete form.client_id; delete form.client_secret;
    }
    if (rest === '/protocol/openid-connect/token' && form.grant_type === DEVICE_GRANT && form.device_code) {
      // RFC 8628 slow_down, as Keycloak: a poll sooner than `interval` after the previous one
      const dc = String(form.device_code); const t = Date.now();
      const last = lastPoll.get(dc);
      if (last !== undefined && t - last < DEVICE_INTERVAL * 1000) {
        return oauthError(res, 400, 'slow_down', 'Slow down');
      }
      lastPoll.set(dc, t);
      if (lastPoll.size > 10000) lastPoll.delete(lastPoll.keys().next().value);
    }
    if (rest === '/protocol/openid-connect/auth/device') {
      if (!form.scope) form.scope = 'openid';
      patchJson(res, (j) => { if (j.device_code) j.interval = DEVICE_INTERVAL; });
    }
    if (rest === '/protocol/openid-connect/token') {
      patchJson(res, (j, status) => {
        if (status !== 200 || !j.access_token) return false;
        Object.assign(j, { refresh_expires_in: j.refresh_token ? RT_TTL : 0, 'not-before-policy': 0 });
        return true;
      });
    }
    req.body = querystring.stringify(form);
  }
  req.originalUrl = req.url;
  req.url = req.url.slice(`/realms/${REALM}`.length) || '/';
  return callback(req, res);
}

newKey();
install();
const server = http.createServer((req, res) => {
  handle(req, res).catch((e) => {
    console.error(e);
    if (!res.headersSent) oauthError(res, 500, 'server_error', String(e.message));
  });
});
server.listen(PORT, HOST, () => console.log(`oidc test peer (oidc-provider, Node ${process.version}) on ${ISSUER}`));
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => { server.close(); process.exit(0); });
