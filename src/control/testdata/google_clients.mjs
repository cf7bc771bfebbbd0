// Drives a running controller with Google's two Node.js clients of the Cloud
// TPU API, on /v2alpha1/ and /v2/, and checks that every reply decodes into
// the library's objects with the right values (google_clients_test.cc runs
// it; docs/control.md, "Google's client libraries", says what it covers):
//   googleapis          google.tpu({version, rootUrl}), discovery REST, JSON
//   @google-cloud/tpu   TpuClient({fallback: 'rest'}) of gax, typed protos
//
// Environment: MS_URL (http://127.0.0.1:PORT), MS_TOKEN (the bearer token),
// MS_NPM_CACHE (the directory scripts/install_npm_test_deps.sh filled),
// MS_REPORT (where the per-call report goes, JSON), MS_PARENT (the
// projects/P/locations/Z the controller's hosts are in). The controller
// needs at least three free cpu-1 hosts in that zone.
//
// Exit status: 0 when every check passed, 1 when one failed, 2 on a setup
// error. Each check is one line on stdout and one entry in the report.
import {writeFileSync} from 'node:fs';
import {createRequire} from 'node:module';
import {join} from 'node:path';

const env = (name) => {
  const v = process.env[name];
  if (!v) {
    console.error(`google_clients.mjs: ${name} is not set`);
    process.exit(2);
  }
  return v;
};
const URL_BASE = env('MS_URL').replace(/\/$/, '');
const TOKEN = env('MS_TOKEN');
const PARENT = env('MS_PARENT');
const PROJECT = PARENT.split('/')[1];
const ZONE = PARENT.split('/')[3];
const REPORT = env('MS_REPORT');
const requireCache = createRequire(join(env('MS_NPM_CACHE'), 'package.json'));

// Cloud TPU names the metadata type of every operation so; gax's REST
// decoder has no such type and fails on every reply that carries one.
const COMMON_METADATA =
    'type.googleapis.com/google.cloud.common.OperationMetadata';
// The async iterators page themselves; gax warns unless told so.
const NO_AUTOPAGINATE = {
  autoPaginate: false
};
const LRO_DECODE_FAILURE =
    'cannot find type google.cloud.common.OperationMetadata';

// ---------------------------------------------------------------- checks

const report = [];
let current = {lib: '', api: ''};

// Runs one library call's check; a thrown error is its failure.
async function check(call, fn) {
  const entry =
      {lib: current.lib, api: current.api, call, ok: true, detail: ''};
  const started = Date.now();
  try {
    const detail = await fn();
    if (detail !== undefined) entry.detail = String(detail);
  } catch (e) {
    entry.ok = false;
    entry.detail = (e && e.stack) ?
        e.stack.split('\n').slice(0, 4).join(' | ') :
        String(e);
  }
  entry.ms = Date.now() - started;
  report.push(entry);
  console.log(
      `${entry.ok ? 'PASS' : 'FAIL'} ${entry.lib} ${entry.api} ` +
      `${call} (${entry.ms} ms)${entry.detail ? ': ' + entry.detail : ''}`);
  return entry.ok;
}

function expect(cond, what) {
  if (!cond) throw new Error(what);
}
function eq(actual, expected, what) {
  const a = JSON.stringify(actual), e = JSON.stringify(expected);
  if (a !== e) throw new Error(`${what}: got ${a}, expected ${e}`);
}
function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
// Polls `fn` every 20 ms until it returns a truthy value (returned), or
// throws after `ms` with the last value seen.
async function until(what, fn, ms = 10000) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e.message;
    }
    if (Date.now() > deadline) {
      throw new Error(
          `timed out waiting for ${what} (last: ${JSON.stringify(last)})`);
    }
    await sleep(20);
  }
}
// The promise rejects (`pred` holds for its error), or this throws.
async function rejects(promise, pred, what) {
  let result;
  try {
    result = await promise;
  } catch (e) {
    if (!pred(e)) {
      throw new Error(`${what}: wrong error: code ${e.code} status ${
          e.status} ${e.message}`);
    }
    return e;
  }
  throw new Error(
      `${what}: succeeded: ${JSON.stringify(result).slice(0, 300)}`);
}

// RFC 3339 text, in the last minute.
function recentRfc3339(text, what) {
  expect(
      typeof text === 'string' &&
          /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$/.test(text),
      `${what}: not RFC 3339: ${text}`);
  recentMs(Date.parse(text), what);
}
// A google.protobuf.Timestamp as gax decodes it ({seconds: '...', nanos}).
function recentTimestamp(ts, what) {
  expect(
      ts && typeof ts.seconds === 'string',
      `${what}: not a Timestamp: ${JSON.stringify(ts)}`);
  recentMs(Number(ts.seconds) * 1000 + ts.nanos / 1e6, what);
}
function recentMs(ms, what) {
  const age = Date.now() - ms;
  expect(age > -5000 && age < 120000, `${what}: ${ms} is not recent`);
}

// The controller's own answer, for what no library shows (`attempt`).
async function raw(path) {
  const res = await fetch(
      URL_BASE + path, {headers: {Authorization: `Bearer ${TOKEN}`}});
  return {status: res.status, body: await res.json()};
}

// The create body of `version`: `slices` cpu-1 slices named after `prefix`
// (one node `${prefix}` when slices is 1). Spellings as each library wants
// them: `durations` in gax's form ({seconds}) or the JSON one ("3600s").
function qrBody(version, slices, prefix, gaxForm) {
  const nodeSpec = {
    parent: PARENT,
    node: {
      acceleratorType: 'cpu-1',
      runtimeVersion: 'tpu-ubuntu2204-base',
      description: `made by ${current.lib}`,
      tags: ['google-clients'],
      metadata: {'startup-script': 'echo hello'},
      networkConfig: {network: 'default', enableExternalIps: true},
    },
  };
  if (slices === 1) {
    nodeSpec.nodeId = prefix;
  } else if (version === 'v2') {
    nodeSpec.multisliceParams = {nodeCount: slices, nodeIdPrefix: prefix};
  } else {
    nodeSpec.multiNodeParams = {nodeCount: slices, nodeIdPrefix: prefix};
  }
  const body = {tpu: {nodeSpec: [nodeSpec]}};
  if (slices === 1) {
    body.spot = {};
  } else {
    body.queueingPolicy = {
      validUntilDuration: gaxForm ? {seconds: 3600} : '3600s',
    };
  }
  return body;
}

// ------------------------------------------------------------ googleapis

// Every method of the discovery client on `version`, through JSON replies.
async function googleapisSuite(google, version) {
  current = {lib: 'googleapis', api: version};
  const auth = new google.auth.OAuth2();
  auth.setCredentials({access_token: TOKEN});
  const tpu = google.tpu({version, rootUrl: URL_BASE + '/', auth});
  const loc = tpu.projects.locations;
  const pre = `ga-${version}`;
  const nameA = `${PARENT}/queuedResources/${pre}-a`;
  const nameB = `${PARENT}/queuedResources/${pre}-b`;
  const httpError = (code, status) => (e) =>
      e.status === code && e.response?.data?.error?.status === status;

  let createOp;
  await check('queuedResources.create', async () => {
    const r = await loc.queuedResources.create({
      parent: PARENT,
      queuedResourceId: `${pre}-a`,
      requestBody: qrBody(version, 2, `${pre}-s`, false),
    });
    eq(r.status, 200, 'HTTP status');
    createOp = r.data;
    expect(createOp.name.startsWith(`${PARENT}/operations/`), createOp.name);
    eq(createOp.metadata['@type'], COMMON_METADATA, 'metadata @type');
    eq(createOp.metadata.verb, 'create', 'verb');
    eq(createOp.metadata.target, nameA, 'target');
    eq(createOp.metadata.apiVersion, version, 'apiVersion');
    recentRfc3339(createOp.metadata.createTime, 'metadata.createTime');
    return createOp.name;
  });
  await check('operations.get (wait for done)', async () => {
    const op = await until('create done', async () => {
      const r = await loc.operations.get({name: createOp.name});
      return r.data.done ? r.data : null;
    });
    eq(op.response['@type'],
       `type.googleapis.com/google.cloud.tpu.${version}.QueuedResource`,
       'response @type');
    eq(op.response.name, nameA, 'response.name');
    recentRfc3339(op.metadata.endTime, 'metadata.endTime');
  });
  await check('queuedResources.get (until ACTIVE)', async () => {
    const qr = await until('ACTIVE', async () => {
      const r = await loc.queuedResources.get({name: nameA});
      return r.data.state.state === 'ACTIVE' ? r.data : null;
    });
    eq(qr.name, nameA, 'name');
    eq(qr.state.stateInitiator, 'USER', 'stateInitiator');
    recentRfc3339(qr.createTime, 'createTime');
    const spec = qr.tpu.nodeSpec[0];
    eq(spec.node.acceleratorType, 'cpu-1', 'acceleratorType');
    eq(spec.node.tags, ['google-clients'], 'tags');
    // As Google's service answers: one node spec per node, with its id.
    eq(qr.tpu.nodeSpec.map((s) => s.nodeId), [`${pre}-s-0`, `${pre}-s-1`],
       'node specs');
    eq(spec[version === 'v2' ? 'multisliceParams' : 'multiNodeParams'],
       undefined, 'multislice params');
    eq(qr.queueingPolicy.validUntilDuration, '3600s', 'validUntilDuration');
  });
  await check('queuedResources.create (spot, nodeId)', async () => {
    const r = await loc.queuedResources.create({
      parent: PARENT,
      queuedResourceId: `${pre}-b`,
      requestBody: qrBody(version, 1, `${pre}-solo`, false),
    });
    eq(r.data.metadata.target, nameB, 'target');
    const qr = await until('B ACTIVE', async () => {
      const b = (await loc.queuedResources.get({name: nameB})).data;
      return b.state.state === 'ACTIVE' ? b : null;
    });
    eq(qr.spot, {}, 'spot');
    eq(qr.tpu.nodeSpec[0].nodeId, `${pre}-solo`, 'nodeId');
  });
  await googleapisErrors(loc, version, pre, httpError);
  await googleapisLists(loc, pre, [nameA, nameB], createOp.name);
  await googleapisResources(loc, pre, nameA);
  await googleapisChanges(loc, pre, nameA, nameB, httpError);
  await check('no token: UNAUTHENTICATED (401)', async () => {
    const anonymous = google.tpu({version, rootUrl: URL_BASE + '/'});
    await rejects(
        anonymous.projects.locations.queuedResources.list({parent: PARENT}),
        httpError(401, 'UNAUTHENTICATED'), 'list without a token');
    const wrong = new google.auth.OAuth2();
    wrong.setCredentials({access_token: 'not-the-token-0123456789'});
    const t = google.tpu({version, rootUrl: URL_BASE + '/', auth: wrong});
    await rejects(
        t.projects.locations.nodes.list({parent: PARENT}),
        httpError(401, 'UNAUTHENTICATED'), 'a wrong token');
  });
}

async function googleapisErrors(loc, version, pre, httpError) {
  await check(
      'queuedResources.create duplicate: ALREADY_EXISTS (409)',
      () => rejects(
          loc.queuedResources.create({
            parent: PARENT,
            queuedResourceId: `${pre}-a`,
            requestBody: qrBody(version, 2, `${pre}-dup`, false),
          }),
          httpError(409, 'ALREADY_EXISTS'), 'second create'));
  await check(
      'queuedResources.create bad id: INVALID_ARGUMENT (400)',
      () => rejects(
          loc.queuedResources.create({
            parent: PARENT,
            queuedResourceId: 'Bad_Id',
            requestBody: qrBody(version, 1, `${pre}-bad`, false),
          }),
          (e) => httpError(400, 'INVALID_ARGUMENT')(e) &&
              e.message.includes('queued_resource_id'),
          'create Bad_Id'));
  await check(
      'queuedResources.get missing: NOT_FOUND (404)',
      () => rejects(
          loc.queuedResources.get({name: `${PARENT}/queuedResources/nope`}),
          httpError(404, 'NOT_FOUND'), 'get nope'));
  await check(
      'operations.get missing: NOT_FOUND (404)',
      () => rejects(
          loc.operations.get({name: `${PARENT}/operations/operation-0`}),
          httpError(404, 'NOT_FOUND'), 'get operation-0'));
}

// Pages through a googleapis list method (a function of the params) with
// pageSize 1.
async function pages(method, params, key) {
  const items = [];
  let pageToken;
  let calls = 0;
  do {
    const r = await method({...params, pageSize: 1, pageToken});
    const page = r.data[key] || [];
    expect(page.length <= 1, `${key}: ${page.length} items on a page of 1`);
    items.push(...page);
    pageToken = r.data.nextPageToken;
    expect(++calls < 1000, `${key}: endless paging`);
  } while (pageToken);
  return {items, calls};
}

async function googleapisLists(loc, pre, qrNames, createOpName) {
  await check('queuedResources.list (pageSize 1, every page)', async () => {
    const {items, calls} = await pages(
        (p) => loc.queuedResources.list(p), {parent: PARENT},
        'queuedResources');
    eq(items.map((q) => q.name).filter((n) => n.includes(`/${pre}-`)), qrNames,
       'names in creation order');
    return `${items.length} queued resources in ${calls} pages`;
  });
  await check('queuedResources.list (zone -)', async () => {
    const r = await loc.queuedResources.list(
        {parent: `projects/${PROJECT}/locations/-`});
    for (const n of qrNames) {
      expect(r.data.queuedResources.some((q) => q.name === n), n);
    }
  });
  await check('operations.list (pageSize 1, every page)', async () => {
    const {items, calls} = await pages(
        (p) => loc.operations.list(p), {name: PARENT}, 'operations');
    const op = items.find((o) => o.name === createOpName);
    expect(op, `${createOpName} listed`);
    eq(op.metadata.verb, 'create', 'verb');
    eq(op.done, true, 'done');
    return `${items.length} operations in ${calls} pages`;
  });
}

async function googleapisResources(loc, pre, nameA) {
  const nodeName = `${PARENT}/nodes/${pre}-s-1`;
  await check('nodes.list (pageSize 1, every page)', async () => {
    const {items} =
        await pages((p) => loc.nodes.list(p), {parent: PARENT}, 'nodes');
    const mine = items.filter((n) => n.name.includes(`/nodes/${pre}-`));
    eq(mine.map((n) => n.name),
       [`${PARENT}/nodes/${pre}-s-0`, nodeName, `${PARENT}/nodes/${pre}-solo`],
       'node names');
    for (const n of mine) {
      eq(n.state, 'READY', `${n.name} state`);
      eq(n.health, 'HEALTHY', `${n.name} health`);
    }
  });
  await check('nodes.get', async () => {
    const n = (await loc.nodes.get({name: nodeName})).data;
    eq(n.name, nodeName, 'name');
    eq(n.acceleratorType, 'cpu-1', 'acceleratorType');
    eq(n.queuedResource, nameA, 'queuedResource');
    eq(n.runtimeVersion, 'tpu-ubuntu2204-base', 'runtimeVersion');
    eq(n.networkEndpoints.length, 1, 'one endpoint per host');
    eq(n.networkEndpoints[0].port, 8470, 'endpoint port');
    recentRfc3339(n.createTime, 'createTime');
  });
  await check('acceleratorTypes.list/get', async () => {
    const list = (await loc.acceleratorTypes.list({parent: PARENT})).data;
    expect(
        list.acceleratorTypes.some(
            (t) => t.name === `${PARENT}/acceleratorTypes/cpu-1`),
        'cpu-1 listed');
    const t = (await loc.acceleratorTypes.get({
                name: `${PARENT}/acceleratorTypes/v4-16`
              })).data;
    eq(t.type, 'v4-16', 'type');
    eq(t.acceleratorConfigs[0].type, 'V4', 'acceleratorConfigs[0].type');
    await rejects(
        loc.acceleratorTypes.get({name: `${PARENT}/acceleratorTypes/v99-3`}),
        (e) => e.status === 404, 'get v99-3');
  });
  await check('runtimeVersions.list/get', async () => {
    const {items} = await pages(
        (p) => loc.runtimeVersions.list(p), {parent: PARENT},
        'runtimeVersions');
    expect(items.some((v) => v.version === 'tpu-ubuntu2204-base'), 'listed');
    const v = (await loc.runtimeVersions.get({
                name: `${PARENT}/runtimeVersions/v2-alpha-tpuv5`
              })).data;
    eq(v, {
      name: `${PARENT}/runtimeVersions/v2-alpha-tpuv5`,
      version: 'v2-alpha-tpuv5'
    },
       'runtime version');
  });
  await check('locations.list/get', async () => {
    const list = (await loc.list({name: `projects/${PROJECT}`})).data;
    expect(list.locations.some((l) => l.locationId === ZONE), 'zone listed');
    const l = (await loc.get({name: PARENT})).data;
    eq(l.name, PARENT, 'name');
    eq(l.locationId, ZONE, 'locationId');
  });
}

// reset, operations.cancel/delete, delete without and with force.
async function googleapisChanges(loc, pre, nameA, nameB, httpError) {
  let resetOp;
  await check('queuedResources.reset (until ACTIVE, attempt 2)', async () => {
    resetOp = (await loc.queuedResources.reset({name: nameA})).data;
    eq(resetOp.metadata.verb, 'reset', 'verb');
    await until(
        'reset done',
        async () => (await loc.operations.get({name: resetOp.name})).data.done);
    const after = await raw(`/${current.api}/${nameA}`);
    eq([after.body.state.state, after.body.attempt], ['ACTIVE', 2],
       'state and attempt');
  });
  await check('operations.cancel', async () => {
    eq((await loc.operations.cancel({name: resetOp.name})).data, {}, 'reply');
  });
  await check('operations.delete', async () => {
    eq((await loc.operations.delete({name: resetOp.name})).data, {}, 'reply');
  });
  await check(
      'queuedResources.delete ACTIVE without force: ' +
          'FAILED_PRECONDITION (400)',
      () => rejects(
          loc.queuedResources.delete({name: nameB}),
          httpError(400, 'FAILED_PRECONDITION'), 'delete B'));
  for (const name of [nameB, nameA]) {
    await check(
        `queuedResources.delete force (${name.split('/').pop()})`, async () => {
          const op =
              (await loc.queuedResources.delete({name, force: true})).data;
          eq(op.metadata.verb, 'delete', 'verb');
          const done = await until('delete done', async () => {
            const r = await loc.operations.get({name: op.name});
            return r.data.done ? r.data : null;
          });
          eq(done.response['@type'],
             'type.googleapis.com/google.protobuf.Empty', 'response @type');
          await rejects(
              loc.queuedResources.get({name}), httpError(404, 'NOT_FOUND'),
              'get after delete');
        });
  }
}

// ----------------------------------------------------- @google-cloud/tpu

// Every method of the generated gax client of `version`, REST transport.
async function gaxSuite(tpuLib, OAuth2Client, version) {
  current = {lib: '@google-cloud/tpu', api: version};
  const auth = new OAuth2Client();
  auth.setCredentials({access_token: TOKEN});
  const url = new URL(URL_BASE);
  const options = {
    fallback: 'rest',
    apiEndpoint: url.hostname,
    port: Number(url.port),
    protocol: 'http'
  };
  const c = new tpuLib[version].TpuClient({...options, auth});
  const pre = `gx-${version}`;
  const nameA = `${PARENT}/queuedResources/${pre}-a`;
  const nameB = `${PARENT}/queuedResources/${pre}-b`;
  // gax maps the HTTP status to a gRPC code, not the body's status.
  const gaxError = (code, text) => (e) =>
      e.code === code && (!text || e.message.includes(text));
  const lroFailure = (e) => e.message.includes(LRO_DECODE_FAILURE);

  for (const [name, slices, suffix] of [[nameA, 2, 's'], [nameB, 1, 'solo']]) {
    const id = name.split('/').pop();
    await check(
        `createQueuedResource ${id}: the documented LRO decode ` +
            'failure, then getQueuedResource until ACTIVE',
        async () => {
          await rejects(
              c.createQueuedResource({
                parent: PARENT,
                queuedResourceId: id,
                queuedResource:
                    qrBody(version, slices, `${pre}-${suffix}`, true),
              }),
              lroFailure, 'createQueuedResource');
          const [qr] = await until('ACTIVE', async () => {
            const r = await c.getQueuedResource({name});
            return r[0].state.state === 'ACTIVE' ? r : null;
          });
          eq(qr.name, name, 'name');
          eq(qr.state.stateInitiator, 'USER', 'stateInitiator');
          recentTimestamp(qr.createTime, 'createTime');
          const spec = qr.tpu.nodeSpec[0];
          eq(spec.node.acceleratorType, 'cpu-1', 'acceleratorType');
          eq(spec.node.metadata, {'startup-script': 'echo hello'}, 'metadata');
          if (slices === 1) {
            eq(spec.nodeId, `${pre}-solo`, 'nodeId');
            eq(qr.tier, 'spot', 'tier oneof');
          } else {
            eq(qr.tpu.nodeSpec.length, 2, 'node specs');
            eq(qr.tpu.nodeSpec[1].nodeId, `${pre}-s-1`, 'nodeId');
            eq(qr.queueingPolicy.validUntilDuration.seconds, '3600',
               'validUntilDuration');
          }
        });
  }
  await gaxErrors(c, tpuLib, OAuth2Client, options, version, pre, gaxError);
  await gaxReads(c, pre, [nameA, nameB]);
  await gaxOperations(c, gaxError, lroFailure);
  await gaxChanges(c, nameA, nameB, gaxError, lroFailure);
}

async function gaxErrors(
    c, tpuLib, OAuth2Client, options, version, pre, gaxError) {
  await check(
      'createQueuedResource duplicate: HTTP 409 ALREADY_EXISTS, ' +
          'which gax reports as code 10 (ABORTED)',
      () => rejects(
          c.createQueuedResource({
            parent: PARENT,
            queuedResourceId: `${pre}-a`,
            queuedResource: qrBody(version, 2, `${pre}-dup`, true),
          }),
          gaxError(10, 'already exists'), 'second create'));
  await check(
      'createQueuedResource bad id: INVALID_ARGUMENT (3)',
      () => rejects(
          c.createQueuedResource({
            parent: PARENT,
            queuedResourceId: 'Bad_Id',
            queuedResource: qrBody(version, 1, `${pre}-bad`, true),
          }),
          gaxError(3, 'queued_resource_id'), 'create Bad_Id'));
  await check(
      'getQueuedResource missing: NOT_FOUND (5)',
      () => rejects(
          c.getQueuedResource({name: `${PARENT}/queuedResources/nope`}),
          gaxError(5, 'not found'), 'get nope'));
  await check(
      'getNode missing: NOT_FOUND (5)',
      () => rejects(
          c.getNode({name: `${PARENT}/nodes/nope`}), gaxError(5),
          'getNode nope'));
  await check('wrong token: UNAUTHENTICATED (16)', async () => {
    const wrong = new OAuth2Client();
    wrong.setCredentials({access_token: 'not-the-token-0123456789'});
    const other = new tpuLib[version].TpuClient({...options, auth: wrong});
    await rejects(
        other.listNodes({parent: PARENT}), gaxError(16),
        'listNodes with a wrong token');
    await other.close();
  });
}

async function gaxReads(c, pre, qrNames) {
  await check('listQueuedResources (pageSize 1, manual pages)', async () => {
    const names = [];
    let request = {parent: PARENT, pageSize: 1};
    let pagesSeen = 0;
    while (request) {
      const [items, next] =
          await c.listQueuedResources(request, {autoPaginate: false});
      expect(items.length <= 1, `${items.length} items on a page of 1`);
      names.push(...items.map((q) => q.name));
      request = next;
      expect(++pagesSeen < 1000, 'endless paging');
    }
    eq(names.filter((n) => n.includes(`/${pre}-`)), qrNames, 'names');
    return `${names.length} in ${pagesSeen} pages`;
  });
  await check('listQueuedResourcesAsync (the library pages)', async () => {
    const names = [];
    for await (const q of c.listQueuedResourcesAsync(
        {parent: PARENT, pageSize: 1}, NO_AUTOPAGINATE)) {
      eq(q.state.state, 'ACTIVE', `${q.name} state`);
      names.push(q.name);
    }
    eq(names.filter((n) => n.includes(`/${pre}-`)), qrNames, 'names');
  });
  await check('listNodes/getNode', async () => {
    const [nodes] = await c.listNodes({parent: PARENT});
    const mine = nodes.filter((n) => n.name.includes(`/nodes/${pre}-`));
    eq(mine.map((n) => n.name.split('/').pop()),
       [`${pre}-s-0`, `${pre}-s-1`, `${pre}-solo`], 'node ids');
    const [n] = await c.getNode({name: mine[0].name});
    eq([n.state, n.health], ['READY', 'HEALTHY'], 'state and health enums');
    eq(n.queuedResource, qrNames[0], 'queuedResource');
    eq(n.networkEndpoints[0].port, 8470, 'endpoint port');
    eq(n.tags, ['google-clients'], 'tags');
    recentTimestamp(n.createTime, 'createTime');
  });
  await check('listAcceleratorTypes/getAcceleratorType', async () => {
    const [types] = await c.listAcceleratorTypes({parent: PARENT});
    const cpu = types.find((t) => t.type === 'cpu-1');
    expect(cpu, 'cpu-1 listed');
    // CPU is no value of Google's AcceleratorConfig.Type enum.
    eq(cpu.acceleratorConfigs[0].type, 'TYPE_UNSPECIFIED', 'cpu-1 config');
    const [v4] = await c.getAcceleratorType(
        {name: `${PARENT}/acceleratorTypes/v5litepod-16`});
    eq(v4.acceleratorConfigs[0].type, 'V5LITE_POD', 'v5litepod config');
  });
  await check('listRuntimeVersions/getRuntimeVersion', async () => {
    const [versions] = await c.listRuntimeVersions({parent: PARENT});
    expect(versions.some((v) => v.version === 'v2-alpha-tpuv6e'), 'listed');
    const [v] = await c.getRuntimeVersion(
        {name: `${PARENT}/runtimeVersions/tpu-vm-base`});
    eq([v.name, v.version],
       [`${PARENT}/runtimeVersions/tpu-vm-base`, 'tpu-vm-base'], 'version');
  });
  await check('getLocation/listLocationsAsync (gax asks on /v1/)', async () => {
    const [l] = await c.getLocation({name: PARENT});
    eq([l.name, l.locationId], [PARENT, ZONE], 'location');
    const zones = [];
    for await (const x of c.listLocationsAsync(
        {name: `projects/${PROJECT}`}, NO_AUTOPAGINATE)) {
      zones.push(x.locationId);
    }
    expect(zones.includes(ZONE), `${ZONE} in ${zones}`);
  });
}

async function gaxOperations(c, gaxError, lroFailure) {
  const ops = (await raw(`/${current.api}/${PARENT}/operations`)).body;
  const opName = ops.operations[0].name;
  await check(
      'getOperation: the documented LRO decode failure',
      () =>
          rejects(c.getOperation({name: opName}), lroFailure, 'getOperation'));
  await check(
      'listOperationsAsync: the documented LRO decode failure', async () => {
        const iterate = async () => {
          for await (const op of c.listOperationsAsync(
              {name: PARENT}, NO_AUTOPAGINATE)) {
            return op;
          }
        };
        await rejects(iterate(), lroFailure, 'listOperationsAsync');
      });
  await check(
      'getOperation missing: NOT_FOUND (5)',
      () => rejects(
          c.getOperation({name: `${PARENT}/operations/operation-0`}),
          gaxError(5), 'getOperation operation-0'));
  await check(
      'cancelOperation/deleteOperation (google.protobuf.Empty)', async () => {
        await c.cancelOperation({name: opName});
        await c.deleteOperation({name: opName});
      });
}

// reset, delete without and with force (their replies are operations).
async function gaxChanges(c, nameA, nameB, gaxError, lroFailure) {
  await check(
      'resetQueuedResource: the documented LRO decode failure, ' +
          'then ACTIVE with attempt 2',
      async () => {
        await rejects(
            c.resetQueuedResource({name: nameA}), lroFailure, 'reset');
        await until('attempt 2 ACTIVE', async () => {
          const r = await raw(`/${current.api}/${nameA}`);
          return r.body.attempt === 2 && r.body.state.state === 'ACTIVE';
        });
        const [qr] = await c.getQueuedResource({name: nameA});
        eq(qr.state.state, 'ACTIVE', 'state');
      });
  await check(
      'deleteQueuedResource ACTIVE without force: HTTP 400 ' +
          'FAILED_PRECONDITION, which gax reports as code 3',
      () => rejects(
          c.deleteQueuedResource({name: nameB}), gaxError(3, 'without force'),
          'delete B'));
  for (const name of [nameB, nameA]) {
    await check(
        `deleteQueuedResource force (${name.split('/').pop()}): the ` +
            'documented LRO decode failure, then NOT_FOUND',
        async () => {
          await rejects(
              c.deleteQueuedResource({name, force: true}), lroFailure,
              'delete');
          await until('gone', async () => {
            try {
              await c.getQueuedResource({name});
              return false;
            } catch (e) {
              if (e.code !== 5) throw e;
              return true;
            }
          });
        });
  }
}

// ------------------------------------------------------------------ main

async function main() {
  let google, tpuLib, OAuth2Client;
  try {
    ({google} = requireCache('googleapis'));
    tpuLib = requireCache('@google-cloud/tpu');
    // gax's own google-auth-library: the one its clients accept.
    const requireGax = createRequire(requireCache.resolve('google-gax'));
    ({OAuth2Client} = requireGax('google-auth-library'));
  } catch (e) {
    console.error(`google_clients.mjs: cannot load the npm packages from ${
        env('MS_NPM_CACHE')} (run scripts/install_npm_test_deps.sh): ${
        e.message}`);
    process.exit(2);
  }
  const versions = {};
  for (const p of ['googleapis', '@google-cloud/tpu', 'google-gax']) {
    versions[p] = requireCache(`${p}/package.json`).version;
  }
  versions['google-auth-library (gax)'] = createRequire(requireCache.resolve(
      'google-gax'))('google-auth-library/package.json')
                                              .version;
  console.log(`versions: ${JSON.stringify(versions)}`);
  try {
    for (const version of ['v2alpha1', 'v2']) {
      await googleapisSuite(google, version);
      await gaxSuite(tpuLib, OAuth2Client, version);
    }
  } finally {
    // Also when a suite threw outside its checks: the test then finds it
    // short of checks.
    writeFileSync(REPORT, JSON.stringify({versions, checks: report}, null, 1));
  }
  const failed = report.filter((e) => !e.ok).length;
  console.log(`${report.length - failed} of ${report.length} checks passed`);
  process.exit(failed ? 1 : 0);
}

await main();
