// multislice console: talks only to this controller's API, with the bearer
// token kept in sessionStorage. No framework; views are switched by the URL
// fragment (#/list, #/create, #/details/ID, #/capacity).
'use strict';

const TOKEN_KEY = 'multislice.token';
const POLL_MS = 2000;
const LOG_POLL_MS = 5000;
const ID_RE = /^[a-z]([-a-z0-9]*[a-z0-9])?$/;
const ID_RULE = 'does not match ^[a-z]([-a-z0-9]*[a-z0-9])?$ (a lowercase letter, then lowercase letters, digits or hyphens, not ending in a hyphen; at most 63 characters)';
const NO_FORCE_STATES = ['ACCEPTED', 'FAILED', 'SUSPENDED', 'DELETING'];
const $ = (id) => document.getElementById(id);

let pollTimer = null;
let lastLogFetch = 0;
let listItems = [];
let hostsCache = [];
const selected = new Set();

// ------------------------------------------------------------------ API

function token() { return sessionStorage.getItem(TOKEN_KEY) || ''; }
function project() { return $('project').value.trim() || 'local'; }
function parent(zone) {
  return '/v2alpha1/projects/' + encodeURIComponent(project()) +
      '/locations/' + encodeURIComponent(zone);
}

class ApiError extends Error {
  constructor(http, status, message) {
    super(message);
    this.http = http;
    this.status = status;
  }
}

async function api(method, path, body) {
  const t = token();
  if (!t) throw new ApiError(401, 'UNAUTHENTICATED', 'no token');
  const init = {method, headers: {'Authorization': 'Bearer ' + t}};
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, 'UNAVAILABLE', 'cannot reach the controller: ' + e.message);
  }
  let data = null;
  try { data = await res.json(); } catch (e) { data = null; }
  if (!res.ok) {
    const err = (data && data.error) || {};
    if (res.status === 401) {
      signOut('The controller refused the token: ' + (err.message || 'HTTP 401'));
    }
    throw new ApiError(res.status, err.status || '', err.message || ('HTTP ' + res.status));
  }
  return data;
}

// ------------------------------------------------------------------ helpers

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// Runs fn, which redraws part of container; the element that had the
// focus (found again by its data-focus-key) keeps it, so polling does not
// throw a keyboard user out of a table.
function keepFocus(container, fn) {
  const active = document.activeElement;
  const key = active && container.contains(active) ? active.dataset.focusKey : '';
  fn();
  if (key) {
    const again = [...container.querySelectorAll('[data-focus-key]')]
        .find((e) => e.dataset.focusKey === key);
    if (again) again.focus();
  }
}

function fillBody(table, rows) {
  const tbody = table.tBodies[0];
  keepFocus(tbody, () => tbody.replaceChildren(...rows));
}

function setStatus(text, isError) {
  const s = $('status');
  s.textContent = text || '';
  s.classList.toggle('error', !!isError);
}

function age(ms) {
  if (!(ms >= 0)) return '';
  const s = Math.floor(ms / 1000);
  if (s < 60) return s + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm' + (s % 60) + 's';
  if (s < 86400) return Math.floor(s / 3600) + 'h' + Math.floor((s % 3600) / 60) + 'm';
  return Math.floor(s / 86400) + 'd' + Math.floor((s % 86400) / 3600) + 'h';
}

function zoneOf(name) {
  const m = /\/locations\/([^/]+)\//.exec(name || '');
  return m ? m[1] : '';
}
function idOf(name) { return (name || '').split('/').pop(); }
function stateOf(qr) { return (qr.state && qr.state.state) || ''; }
function acceleratorOf(qr) {
  try { return qr.tpu.nodeSpec[0].node.acceleratorType || ''; } catch (e) { return ''; }
}
function timeText(t) {
  if (!t) return '';
  const d = new Date(t);
  return isNaN(d) ? t : d.toLocaleString(undefined, {hour12: false}) ;
}

function confirmDialog(title, text, okLabel) {
  return new Promise((resolve) => {
    const d = $('confirm-dialog');
    $('confirm-title').textContent = title;
    $('confirm-text').textContent = text;
    $('confirm-ok').textContent = okLabel || 'OK';
    d.returnValue = '';
    d.addEventListener('close', () => resolve(d.returnValue === 'ok'), {once: true});
    d.showModal();
    $('confirm-cancel').focus();
  });
}

// ------------------------------------------------------------------ views

const VIEWS = ['login', 'list', 'create', 'details', 'capacity'];

function show(view) {
  for (const v of VIEWS) $('view-' + v).hidden = v !== view;
  $('nav').hidden = view === 'login';
  for (const [id, v] of [['nav-list', 'list'], ['nav-create', 'create'], ['nav-capacity', 'capacity']]) {
    if (v === view) $(id).setAttribute('aria-current', 'page');
    else $(id).removeAttribute('aria-current');
  }
}

function route() {
  clearTimeout(pollTimer);
  setStatus('');
  if (!token()) {
    show('login');
    document.title = 'Sign in - multislice console';
    $('token').focus();
    return;
  }
  const hash = location.hash || '#/list';
  let m;
  if ((m = /^#\/details\/(.+)$/.exec(hash))) {
    show('details');
    lastLogFetch = 0;
    refreshDetails(decodeURIComponent(m[1]));
  } else if (hash === '#/create') {
    show('create');
    document.title = 'Create - multislice console';
    prepareCreate();
  } else if (hash === '#/capacity') {
    show('capacity');
    document.title = 'Capacity - multislice console';
    refreshCapacity();
  } else {
    show('list');
    document.title = 'Queued resources - multislice console';
    refreshList();
  }
}

function schedule(fn, ms) {
  clearTimeout(pollTimer);
  pollTimer = setTimeout(fn, ms || POLL_MS);
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  clearTimeout(pollTimer);
  $('token-error').textContent = message || '';
  route();
}

// ------------------------------------------------------------------ sign in

async function onTokenSubmit(ev) {
  ev.preventDefault();
  const t = $('token').value.trim();
  $('token-error').textContent = '';
  if (!t) {
    $('token-error').textContent = 'Enter the token.';
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, t);
  try {
    await api('GET', '/internal/v1/hosts');
  } catch (e) {
    if (e.http !== 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      $('token-error').textContent = e.message;
    }
    return;
  }
  $('token').value = '';
  route();
  setStatus('Signed in.');
  $('main').focus();
}

// ------------------------------------------------------------------ list

async function refreshList() {
  if ($('view-list').hidden) return;
  try {
    const items = [];
    let pageToken = '';
    for (let i = 0; i < 20; ++i) {
      const q = '?pageSize=1000' + (pageToken ? '&pageToken=' + encodeURIComponent(pageToken) : '');
      const data = await api('GET', parent('-') + '/queuedResources' + q);
      items.push(...(data.queuedResources || []));
      pageToken = data.nextPageToken || '';
      if (!pageToken) break;
    }
    listItems = items;
    renderList();
    if (!$('status').classList.contains('error')) setStatus('Updated ' + new Date().toLocaleTimeString(undefined, {hour12: false}));
  } catch (e) {
    if (e.http === 401) return;
    setStatus(e.message, true);
  }
  if (!$('view-list').hidden) schedule(refreshList);
}

function renderList() {
  const stateFilter = $('filter-state').value;
  const zoneSelect = $('filter-zone');
  const zoneFilter = zoneSelect.value;
  const zones = [...new Set(listItems.map((q) => zoneOf(q.name)))].sort();
  const known = [...zoneSelect.options].slice(1).map((o) => o.value);
  if (zones.join() !== known.join()) {
    zoneSelect.replaceChildren(el('option', {value: ''}, 'all'),
        ...zones.map((z) => el('option', {value: z}, z)));
    zoneSelect.value = zones.includes(zoneFilter) ? zoneFilter : '';
  }
  const now = Date.now();
  const shown = listItems.filter((q) =>
      (!stateFilter || stateOf(q) === stateFilter) &&
      (!zoneSelect.value || zoneOf(q.name) === zoneSelect.value));
  const names = new Set(listItems.map((q) => q.name));
  for (const n of [...selected]) if (!names.has(n)) selected.delete(n);
  let idle = 0, idleChips = 0;
  const rows = shown.map((q) => {
    const id = idOf(q.name);
    const state = stateOf(q);
    const holds = (state === 'FAILED' || state === 'SUSPENDED') && q.quotaHeldChips > 0;
    if (holds) { ++idle; idleChips += q.quotaHeldChips; }
    const box = el('input', {type: 'checkbox', class: 'row-select', 'data-name': q.name,
      'data-focus-key': 'box:' + q.name,
      'aria-label': 'Select ' + id, checked: selected.has(q.name)});
    box.addEventListener('change', () => {
      if (box.checked) selected.add(q.name); else selected.delete(q.name);
      updateDeleteButton();
    });
    const stateCell = el('td', {class: 'state'}, el('span', {class: 'state-' + state}, state));
    if (holds) {
      stateCell.append(el('span', {class: 'badge', title: 'Still counted against the ' + q.tier + ' quota until deleted'},
          'holds ' + q.quotaHeldChips + ' chips'));
    }
    return el('tr', {'data-name': q.name, 'data-id': id, class: holds ? 'holds-quota' : ''},
        el('td', {}, box),
        el('td', {}, el('a', {href: '#/details/' + encodeURIComponent(id), 'data-qr': id,
          'data-focus-key': 'link:' + q.name}, id)),
        el('td', {}, zoneOf(q.name)),
        el('td', {}, String((q.nodes || []).length)),
        el('td', {}, acceleratorOf(q)),
        stateCell,
        el('td', {}, q.tier || ''),
        el('td', {}, age(now - Date.parse(q.createTime))));
  });
  fillBody($('qr-table'), rows);
  $('list-empty').hidden = shown.length > 0;
  const note = $('quota-note');
  note.hidden = idle === 0;
  note.textContent = idle ? idle + ' FAILED or SUSPENDED queued resource' + (idle > 1 ? 's' : '') +
      ' still hold' + (idle > 1 ? '' : 's') + ' ' + idleChips +
      ' chips of quota (marked below); delete them to release it.' : '';
  $('select-all').checked = shown.length > 0 && shown.every((q) => selected.has(q.name));
  updateDeleteButton();
}

function updateDeleteButton() {
  const b = $('delete-selected');
  b.disabled = selected.size === 0;
  b.textContent = selected.size ? 'Delete selected (' + selected.size + ')' : 'Delete selected';
}

// Deletes the queued resources named; asks for force when one needs it.
async function deleteResources(names) {
  const byName = new Map(listItems.map((q) => [q.name, q]));
  const needForce = names.filter((n) => byName.has(n) && !NO_FORCE_STATES.includes(stateOf(byName.get(n))));
  let force = false;
  if (needForce.length) {
    force = await confirmDialog('Force delete?',
        needForce.map(idOf).join(', ') + (needForce.length > 1 ? ' are' : ' is') +
        ' not ACCEPTED, FAILED or SUSPENDED: deleting needs force, which stops ' +
        'the startup scripts and deletes the nodes first. Delete ' + names.length +
        ' queued resource' + (names.length > 1 ? 's' : '') + ' with force?', 'Force delete');
  } else {
    force = false;
    if (!await confirmDialog('Delete?', 'Delete ' + names.map(idOf).join(', ') + '?', 'Delete')) return false;
  }
  if (needForce.length && !force) return false;
  const failures = [];
  for (const name of names) {
    const path = '/v2alpha1/' + name.split('/').map(encodeURIComponent).join('/');
    try {
      await api('DELETE', path + (force ? '?force=true' : ''));
      selected.delete(name);
    } catch (e) {
      if (e.http === 400 && e.status === 'FAILED_PRECONDITION' && !force) {
        // The state moved since the table was drawn: ask for force now.
        if (await confirmDialog('Force delete?', e.message, 'Force delete')) {
          try { await api('DELETE', path + '?force=true'); selected.delete(name); continue; } catch (e2) { e = e2; }
        } else {
          continue;
        }
      }
      failures.push(idOf(name) + ': ' + e.message);
    }
  }
  if (failures.length) setStatus('Delete failed: ' + failures.join('; '), true);
  else setStatus('Delete requested for ' + names.map(idOf).join(', ') + '.');
  return failures.length === 0;
}

// ------------------------------------------------------------------ create

async function prepareCreate() {
  try {
    const data = await api('GET', '/internal/v1/hosts');
    hostsCache = data.hosts || [];
  } catch (e) {
    if (e.http !== 401) setStatus(e.message, true);
  }
  const zones = [...new Set(hostsCache.map((h) => h.zone))].sort();
  $('zones').replaceChildren(...zones.map((z) => el('option', {value: z})));
  if (!$('f-zone').value && zones.length) $('f-zone').value = zones[0];
  fillAccelerators();
  $('f-name').focus();
}

function fillAccelerators() {
  const zone = $('f-zone').value.trim();
  const sel = $('f-accel');
  const prev = sel.value;
  const types = [...new Set(hostsCache.filter((h) => !zone || h.zone === zone)
      .map((h) => h.acceleratorType))].sort();
  if (!types.length) {
    sel.replaceChildren(el('option', {value: ''}, 'no hosts in this zone'));
  } else {
    sel.replaceChildren(...types.map((t) => {
      const n = hostsCache.filter((h) => h.acceleratorType === t && (!zone || h.zone === zone));
      const free = n.filter((h) => !h.lost && !h.queuedResource).length;
      return el('option', {value: t}, t + ' (' + free + ' of ' + n.length + ' hosts free)');
    }));
    if (types.includes(prev)) sel.value = prev;
  }
}

function syncMultislice() {
  const on = $('f-multislice').checked;
  $('f-slices').disabled = !on;
  $('f-prefix').disabled = !on;
}

const FIELD_ERRORS = ['name', 'zone', 'accel', 'runtime', 'slices', 'prefix', 'tier',
  'valid-until', 'network', 'tags', 'script', 'form'];
const FIELD_INPUTS = {name: 'f-name', zone: 'f-zone', accel: 'f-accel', runtime: 'f-runtime',
  slices: 'f-slices', prefix: 'f-prefix', tier: 'f-tier', 'valid-until': 'f-valid-until',
  network: 'f-network', tags: 'f-tags', script: 'f-script'};

function clearErrors() {
  for (const f of FIELD_ERRORS) {
    $('err-' + f).textContent = '';
    $('err-' + f).removeAttribute('data-source');
    if (FIELD_INPUTS[f]) $(FIELD_INPUTS[f]).removeAttribute('aria-invalid');
  }
}

function fieldError(field, message, source) {
  const e = $('err-' + field);
  e.textContent = message;
  e.setAttribute('data-source', source);
  if (FIELD_INPUTS[field]) $(FIELD_INPUTS[field]).setAttribute('aria-invalid', 'true');
}

// The field of the form an API error message names (its snake_case path).
function fieldOfApiMessage(message) {
  const path = (message.split(':')[0] || '').trim();
  const rules = [
    [/^queued_resource_id/, 'name'],
    [/^parent/, 'zone'],
    [/accelerator_type/, 'accel'],
    [/runtime_version/, 'runtime'],
    [/node_count/, 'slices'],
    [/node_id_prefix|node_id$/, 'prefix'],
    [/^(guaranteed|spot|best_effort|reservation_name)/, 'tier'],
    [/^queueing_policy/, 'valid-until'],
    [/network_config/, 'network'],
    [/\.tags/, 'tags'],
    [/metadata/, 'script'],
  ];
  for (const [re, f] of rules) if (re.test(path)) return f;
  return 'form';
}

function utf8Length(s) { return new TextEncoder().encode(s).length; }

// The API's checks (api_types.cc, HandleCreate), worded as the API words them.
function clientChecks(v) {
  const errors = [];
  if (!v.name) errors.push(['name', 'queued_resource_id: is required']);
  else if (!ID_RE.test(v.name) || v.name.length > 63) {
    errors.push(['name', "queued_resource_id: '" + v.name.slice(0, 64) +
        "' " + ID_RULE]);
  }
  if (!v.zone) errors.push(['zone', 'parent: the zone is required']);
  else if (v.zone === '-' || v.zone.includes('/')) errors.push(['zone', "parent: a queued resource is created in one zone, not '" + v.zone + "'"]);
  if (!v.accel) errors.push(['accel', 'tpu.node_spec[0].node.accelerator_type: is required']);
  if (utf8Length(v.runtime) > 1024) errors.push(['runtime', 'tpu.node_spec[0].node.runtime_version: longer than 1024 bytes']);
  if (v.multislice) {
    if (!/^\d+$/.test(v.slices) || +v.slices < 2 || +v.slices > 256) {
      errors.push(['slices', 'tpu.node_spec[0].multi_node_params.node_count: ' + (v.slices || 'nothing') + ' is outside 2..256']);
    }
    if (v.prefix && !ID_RE.test(v.prefix)) {
      errors.push(['prefix', "tpu.node_spec[0].multi_node_params.node_id_prefix: '" + v.prefix + "' " + ID_RULE]);
    }
  }
  if (v.validUntil && (!/^\d+$/.test(v.validUntil) || +v.validUntil < 1)) {
    errors.push(['valid-until', 'queueing_policy.valid_until_duration: expected a positive number of seconds']);
  }
  if (utf8Length(v.network) > 1024) errors.push(['network', 'tpu.node_spec[0].node.network_config.network: longer than 1024 bytes']);
  if (v.tags.length > 64) errors.push(['tags', 'tpu.node_spec[0].node.tags: more than 64 entries']);
  v.tags.forEach((t, i) => {
    if (utf8Length(t) > 1024) errors.push(['tags', 'tpu.node_spec[0].node.tags[' + i + ']: expected a string of at most 1024 bytes']);
  });
  if (utf8Length(v.script) > 256 * 1024) {
    errors.push(['script', 'tpu.node_spec[0].node.metadata["startup-script"]: expected a string of at most 262144 bytes']);
  }
  return errors;
}

function formValues() {
  return {
    name: $('f-name').value.trim(),
    zone: $('f-zone').value.trim(),
    accel: $('f-accel').value,
    runtime: $('f-runtime').value.trim(),
    multislice: $('f-multislice').checked,
    slices: $('f-slices').value.trim(),
    prefix: $('f-prefix').value.trim(),
    tier: $('f-tier').value,
    validUntil: $('f-valid-until').value.trim(),
    network: $('f-network').value.trim(),
    tags: $('f-tags').value.split(',').map((t) => t.trim()).filter((t) => t),
    script: $('f-script').value,
  };
}

function requestBody(v) {
  const node = {acceleratorType: v.accel};
  if (v.runtime) node.runtimeVersion = v.runtime;
  if (v.network) node.networkConfig = {network: v.network};
  if (v.tags.length) node.tags = v.tags;
  if (v.script) node.metadata = {'startup-script': v.script};
  const spec = {parent: 'projects/' + project() + '/locations/' + v.zone, node};
  if (v.multislice) {
    spec.multiNodeParams = {nodeCount: Number(v.slices)};
    if (v.prefix) spec.multiNodeParams.nodeIdPrefix = v.prefix;
  }
  const body = {tpu: {nodeSpec: [spec]}};
  if (v.tier === 'reserved') body.guaranteed = {reserved: true};
  else if (v.tier === 'spot') body.spot = {};
  else if (v.tier === 'best-effort') body.bestEffort = {};
  if (v.validUntil) body.queueingPolicy = {validUntilDuration: v.validUntil + 's'};
  return body;
}

async function onCreateSubmit(ev) {
  ev.preventDefault();
  clearErrors();
  const v = formValues();
  const form = $('create-form');
  if (form.dataset.clientChecks !== 'off') {
    const errors = clientChecks(v);
    if (errors.length) {
      for (const [f, m] of errors) if (!$('err-' + f).textContent) fieldError(f, m, 'client');
      $(FIELD_INPUTS[errors[0][0]]).focus();
      setStatus('Fix the marked fields.', true);
      return;
    }
  }
  $('create-submit').disabled = true;
  try {
    await api('POST', parent(v.zone) + '/queuedResources?queued_resource_id=' +
        encodeURIComponent(v.name), requestBody(v));
    setStatus('Created ' + v.name + '.');
    $('f-name').value = '';
    location.hash = '#/list';
  } catch (e) {
    if (e.http === 401) return;
    const f = fieldOfApiMessage(e.message);
    fieldError(f, e.message, 'api');
    setStatus('The controller refused the request (' + (e.status || e.http) + ').', true);
    if (FIELD_INPUTS[f]) $(FIELD_INPUTS[f]).focus();
  } finally {
    $('create-submit').disabled = false;
  }
}

// ------------------------------------------------------------------ details

let detailsQr = null;

async function refreshDetails(id) {
  if ($('view-details').hidden) return;
  document.title = id + ' - multislice console';
  $('details-title').textContent = 'Queued resource ' + id;
  try {
    const list = await api('GET', parent('-') + '/queuedResources?pageSize=1000');
    let qr = (list.queuedResources || []).find((q) => idOf(q.name) === id);
    if (!qr) {
      $('details-error').textContent = 'Queued resource ' + id + ' not found (deleted?).';
      $('details-state').textContent = 'gone';
      $('reset-btn').disabled = true;
      $('delete-btn').disabled = true;
      detailsQr = null;
      schedule(() => refreshDetails(id));
      return;
    }
    qr = await api('GET', '/v2alpha1/' + qr.name.split('/').map(encodeURIComponent).join('/'));
    detailsQr = qr;
    $('details-error').textContent = '';
    renderDetails(qr);
    const ops = await api('GET', '/internal/v1/queuedResources/' + encodeURIComponent(id) + '/operations');
    renderOps(ops.operations || []);
    if (Date.now() - lastLogFetch > LOG_POLL_MS) {
      lastLogFetch = Date.now();
      refreshLogs(id);
    }
  } catch (e) {
    if (e.http === 401) return;
    $('details-error').textContent = e.message;
  }
  if (!$('view-details').hidden) schedule(() => refreshDetails(id));
}

function renderDetails(qr) {
  const state = stateOf(qr);
  $('details-state').textContent = state;
  $('details-state').className = 'state-' + state;
  $('details-attempt').textContent = String(qr.attempt || 0);
  $('details-tier').textContent = qr.tier || '';
  $('details-quota').textContent = qr.quotaHeldChips ? 'Holds ' + qr.quotaHeldChips + ' chips of quota' : '';
  $('reset-btn').disabled = state !== 'ACTIVE';
  $('delete-btn').disabled = state === 'DELETING';
  fillBody($('history-table'), (qr.stateHistory || []).slice().reverse().map((h) =>
    el('tr', {}, el('td', {}, timeText(h.time)), el('td', {class: 'state-' + h.state}, h.state),
        el('td', {}, h.initiator))));
  fillBody($('nodes-table'), (qr.nodes || []).map((n) =>
    el('tr', {'data-node': n.nodeId}, el('td', {}, n.nodeId), el('td', {class: 'mono'}, (n.hosts || []).join(', ') || 'none'),
        el('td', {class: 'state-' + n.state}, n.state), el('td', {class: 'state-' + n.health}, n.health),
        el('td', {}, String(qr.attempt || 0)))));
  const failed = qr.state && qr.state.failedData && qr.state.failedData.error;
  if (failed) $('details-error').textContent = 'Failed: ' + failed.message;
}

function renderOps(ops) {
  fillBody($('ops-table'), ops.slice().reverse().map((op) => {
    const md = op.metadata || {};
    const result = !op.done ? 'running' : (op.error ? 'error: ' + op.error.message : 'ok');
    return el('tr', {}, el('td', {}, md.verb || ''), el('td', {}, timeText(md.createTime)),
        el('td', {}, md.endTime ? timeText(md.endTime) : ''), el('td', {}, result));
  }));
}

// The hang digest's lines in the workers' log tails (multislice train
// prints them on a stuck collective, docs/observability.md): the first
// worker's that has them, without the launcher's prefixes.
function hangDigestLines(workers) {
  for (const w of workers) {
    const lines = (w.log || '').split('\n').map((l) => l.replace(/^(\[[^\]]*\] )+/, ''));
    const start = lines.findIndex((l) => / hang digest: /.test(l));
    if (start < 0) continue;
    const out = [lines[start].replace(/^multislice: [^:]*: /, '')];
    for (const l of lines.slice(start + 1)) {
      if (/^\s+culprit: |^\s+digest: |^\s+no culprit /.test(l)) out.push(l.trim());
      else if (/the job is stuck/.test(l)) { out.push(l.replace(/^multislice train: /, '')); break; }
    }
    return out;
  }
  return [];
}

function renderHangDigest(workers) {
  const lines = hangDigestLines(workers);
  $('hang-digest').hidden = lines.length === 0;
  $('hang-lines').textContent = lines.join('\n');
}

async function refreshLogs(id) {
  try {
    const data = await api('GET', '/internal/v1/queuedResources/' + encodeURIComponent(id) + '/logs?bytes=4096');
    const blocks = (data.workers || []).map((w) => el('div', {class: 'log', 'data-worker': w.name},
        el('h4', {}, w.node + ' worker ' + w.worker + ' (' + w.hostId + ')'),
        w.error ? el('p', {class: 'field-error'}, w.error) : null,
        el('pre', {tabindex: '0', 'aria-label': 'Log tail of ' + w.name, 'data-focus-key': 'log:' + w.name},
            w.log || '(empty)')));
    keepFocus($('logs'), () => $('logs').replaceChildren(
        ...(blocks.length ? blocks : [el('p', {class: 'note'}, 'No workers.')])));
    renderHangDigest(data.workers || []);
  } catch (e) {
    if (e.http === 401) return;
    $('logs').replaceChildren(el('p', {class: 'field-error'}, e.message));
  }
}

async function onReset() {
  if (!detailsQr) return;
  const id = idOf(detailsQr.name);
  if (!await confirmDialog('Reset?', 'Reset ' + id + ': stop every worker and run the startup scripts again (attempt ' +
      ((detailsQr.attempt || 0) + 1) + ')?', 'Reset')) return;
  try {
    await api('POST', '/v2alpha1/' + detailsQr.name.split('/').map(encodeURIComponent).join('/') + ':reset');
    setStatus('Reset requested for ' + id + '.');
    lastLogFetch = 0;
    refreshDetails(id);
  } catch (e) {
    if (e.http !== 401) $('details-error').textContent = e.message;
  }
}

async function onDeleteOne() {
  if (!detailsQr) return;
  listItems = [detailsQr];
  if (await deleteResources([detailsQr.name])) location.hash = '#/list';
}

// ------------------------------------------------------------------ capacity

async function refreshCapacity() {
  if ($('view-capacity').hidden) return;
  try {
    const data = await api('GET', '/internal/v1/capacity');
    fillBody($('tier-table'), (data.tiers || []).map((t) =>
      el('tr', {}, el('td', {}, t.tier), el('td', {}, String(t.usedChips)),
          el('td', {}, t.quotaChips < 0 ? 'unlimited' : String(t.quotaChips)),
          el('td', {class: t.heldByFailedOrSuspendedChips ? 'state-FAILED' : ''},
              t.heldByFailedOrSuspendedChips ? t.heldByFailedOrSuspendedChips + ' chips (' + t.failedOrSuspended +
              ' queued resource' + (t.failedOrSuspended > 1 ? 's' : '') + ')' : '0'))));
    const groups = new Map();
    for (const h of data.hosts || []) {
      const key = h.zone + '\u0000' + h.acceleratorType;
      if (!groups.has(key)) groups.set(key, {zone: h.zone, type: h.acceleratorType, total: 0, FREE: 0, USED: 0, LOST: 0});
      const g = groups.get(key);
      ++g.total; ++g[h.state];
    }
    fillBody($('capacity-summary'), [...groups.values()].sort((a, b) => (a.zone + a.type).localeCompare(b.zone + b.type)).map((g) =>
      el('tr', {}, el('td', {}, g.zone), el('td', {}, g.type), el('td', {}, String(g.total)),
          el('td', {}, String(g.FREE)), el('td', {}, String(g.USED)), el('td', {}, String(g.LOST)))));
    fillBody($('capacity-hosts'), (data.hosts || []).map((h) =>
      el('tr', {}, el('td', {class: 'mono'}, h.id + ' ' + (h.hostname ? '(' + h.hostname + ')' : '')),
          el('td', {}, h.zone), el('td', {}, h.acceleratorType),
          el('td', {class: 'state-' + h.state, title: h.lostReason || ''}, h.state),
          el('td', {}, h.queuedResource ? el('a', {href: '#/details/' + encodeURIComponent(idOf(h.queuedResource))}, idOf(h.queuedResource)) : ''),
          el('td', {}, h.heartbeatAgeMs < 60000 ? (Math.max(0, h.heartbeatAgeMs) / 1000).toFixed(1) + 's' : age(h.heartbeatAgeMs)))));
  } catch (e) {
    if (e.http !== 401) setStatus(e.message, true);
  }
  if (!$('view-capacity').hidden) schedule(refreshCapacity);
}

// ------------------------------------------------------------------ wiring

document.addEventListener('DOMContentLoaded', () => {
  $('token-form').addEventListener('submit', onTokenSubmit);
  $('sign-out').addEventListener('click', () => signOut('Token forgotten.'));
  $('filter-state').addEventListener('change', renderList);
  $('filter-zone').addEventListener('change', renderList);
  $('select-all').addEventListener('change', () => {
    for (const box of document.querySelectorAll('#qr-table .row-select')) {
      box.checked = $('select-all').checked;
      if (box.checked) selected.add(box.dataset.name); else selected.delete(box.dataset.name);
    }
    updateDeleteButton();
  });
  $('delete-selected').addEventListener('click', async () => {
    if (selected.size) await deleteResources([...selected]);
    refreshList();
  });
  $('create-form').addEventListener('submit', onCreateSubmit);
  $('f-zone').addEventListener('input', fillAccelerators);
  $('f-multislice').addEventListener('change', syncMultislice);
  $('reset-btn').addEventListener('click', onReset);
  $('delete-btn').addEventListener('click', onDeleteOne);
  $('logs-refresh').addEventListener('click', () => { if (detailsQr) refreshLogs(idOf(detailsQr.name)); });
  $('project').addEventListener('change', route);
  window.addEventListener('hashchange', route);
  syncMultislice();
  route();
});
