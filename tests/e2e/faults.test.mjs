// The package's fault paths in headless Chromium, on SmolLM2-135M (the CPU engine where
// the GPU is not the point, a few tokens each): a worker whose wasm traps (a panic, on its
// own thread or on a thread of the threaded build's CPU pool) is
// replaced and the engine answers on; concurrent requests queue or fail with 'Busy'; a
// download cut mid-file or a short file leaves nothing in Cache Storage and a retry
// loads; a cached copy (model or drafter) that is corrupt or does not parse is fetched
// again and re-cached, and a drafter's pinned sha256s are checked as the model's; a lost GPU device is 'DeviceLost' and a new engine loads. One
// browser, one context per test (each starts with an empty cache).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { serve } from '../../www/serve.mjs';
import { launch, watch, DRAFTER, MODEL, MODEL_FILE } from './common.mjs';

const URL_PATH = `/models/${MODEL_FILE}`;
let srv, browser;
before(async () => { srv = await serve({ port: 0, isolated: false }); browser = await launch(); });
after(async () => { await browser?.close(); srv?.server.close(); });

/** A page of a fresh browser context (empty Cache Storage) with the package loaded as `window.m`. */
async function freshPage(tag) {
  const context = await browser.newContext();
  const page = await context.newPage();
  watch(page, tag);
  await page.goto(`${srv.url}/www/index.html?model=none`);
  await page.evaluate(async () => { window.m = await import('/pkg/index.js'); });
  return page;
}

/** What Cache Storage holds: the keys of the weight cache and of the meta cache. */
const CACHE_KEYS = async () => {
  const { CACHE, META } = await import('/pkg/protocol.js');
  const keys = async (name) => (await (await caches.open(name)).keys()).map((r) => new URL(r.url).pathname);
  return { files: await keys(CACHE), metas: await keys(META) };
};

test('a panic in the worker fails its request with code Panic; a new worker reloads and answers the queued requests', { timeout: 300_000 }, async () => {
  const page = await freshPage('trap');
  const r = await page.evaluate(async (model) => {
    const engine = await m.createEngine({ model, engine: 'cpu' });
    const req = { messages: [{ role: 'user', content: 'Name three colors.' }], max_tokens: 4, temperature: 0 };
    const text = async (p) => (await p).choices[0].message.content;
    const before = await text(engine.chat.completions.create(req));
    const trap = engine.__testTrap('deliberate test panic 42').then(() => null, (e) => ({ code: e.code, message: e.message }));
    // Queued behind the trap in the worker that dies: sent again to the new one.
    const queued = text(engine.chat.completions.create(req));
    const trapped = await trap;
    // Made while the new worker loads: waits for it.
    const during = text(engine.chat.completions.create({ ...req, stream: false }));
    const pendingDuring = engine.pending;
    const [a, b] = await Promise.all([queued, during]);
    const after = await text(engine.chat.completions.create(req));
    const out = { before, trapped, a, b, after, pendingDuring, pending: engine.pending, restarts: engine.restarts, fromCache: engine.info.from_cache };
    await engine.unload();
    return out;
  }, URL_PATH);
  console.log(JSON.stringify(r));
  assert.equal(r.trapped.code, 'Panic');
  assert.match(r.trapped.message, /^deliberate test panic 42 \(at .*src\/wasm\/mod\.rs:\d+\)$/);
  assert.ok(r.before.length > 0);
  assert.equal(r.a, r.before, 'the request queued behind the trap is answered by the new worker');
  assert.equal(r.b, r.before, 'a request made during the reload is answered');
  assert.equal(r.after, r.before);
  assert.equal(r.pendingDuring, 2);
  assert.equal(r.pending, 0);
  assert.equal(r.restarts, 1);
  assert.equal(r.fromCache, true, 'the new worker reloads from Cache Storage');
});

test('a panic on a thread of the CPU pool fails its request with code Panic; a new worker answers on', { timeout: 300_000 }, async () => {
  // The threaded build needs a cross-origin isolated page.
  const isolated = await serve({ port: 0, isolated: true });
  try {
    const context = await browser.newContext();
    const page = await context.newPage();
    watch(page, 'pool-panic');
    await page.goto(`${isolated.url}/www/index.html?model=none`);
    const r = await page.evaluate(async (model) => {
      const m = await import('/pkg/index.js');
      const engine = await m.createEngine({ model, engine: 'cpu', threads: 2 });
      const req = { messages: [{ role: 'user', content: 'Name three colors.' }], max_tokens: 4, temperature: 0 };
      const text = async (p) => (await p).choices[0].message.content;
      const before = await text(engine.chat.completions.create(req));
      const threads = engine.info.cpu?.threads;
      const panic = engine.__testPoolPanic('deliberate pool panic 7').then(() => null, (e) => ({ code: e.code, message: e.message }));
      // Queued behind it in the worker that blocks: sent again to the new one.
      const queued = text(engine.chat.completions.create(req));
      const trapped = await panic;
      const after = await queued;
      const out = { before, threads, trapped, after, restarts: engine.restarts, isolated: self.crossOriginIsolated };
      await engine.unload();
      return out;
    }, URL_PATH);
    console.log(JSON.stringify(r));
    assert.equal(r.isolated, true);
    assert.equal(r.threads, 2, 'the threaded build, two pool threads');
    assert.equal(r.trapped?.code, 'Panic', JSON.stringify(r));
    assert.match(r.trapped.message, /^deliberate pool panic 7 \(at .*src\/wasm\/mod\.rs:\d+\)$/);
    assert.equal(r.after, r.before, 'the request queued behind the panic is answered by the new worker');
    assert.equal(r.restarts, 1);
  } finally {
    isolated.server.close();
  }
});

test("concurrent requests queue by default; with ifBusy 'reject' they fail at once with Busy", { timeout: 300_000 }, async () => {
  const page = await freshPage('busy');
  const r = await page.evaluate(async (model) => {
    const req = { messages: [{ role: 'user', content: 'Name three colors.' }], max_tokens: 4, temperature: 0 };
    const text = async (p) => (await p).choices[0].message.content;
    const queue = await m.createEngine({ model, engine: 'cpu' });
    const first = text(queue.chat.completions.create(req));
    const second = text(queue.chat.completions.create(req));
    const queuedPending = queue.pending;
    const queued = await Promise.all([first, second]);
    const queuedAfter = queue.pending;
    await queue.unload();
    const reject = await m.createEngine({ model, engine: 'cpu', ifBusy: 'reject' });
    const running = text(reject.chat.completions.create(req));
    const t0 = performance.now();
    const busy = await reject.chat.completions.create(req).then(() => null, (e) => e.code);
    const busyStream = await (async () => { try { for await (const _ of reject.chat.completions.create({ ...req, stream: true })); return null; } catch (e) { return e.code; } })();
    const busy_ms = performance.now() - t0;
    const ran = await running;
    const next = await text(reject.chat.completions.create(req));
    await reject.unload();
    return { queuedPending, queued, queuedAfter, busy, busyStream, busy_ms, ran, next };
  }, URL_PATH);
  console.log(JSON.stringify(r));
  assert.equal(r.queuedPending, 2);
  assert.equal(r.queued[1], r.queued[0]);
  assert.equal(r.queuedAfter, 0);
  assert.equal(r.busy, 'Busy');
  assert.equal(r.busyStream, 'Busy');
  assert.ok(r.busy_ms < 1000, `Busy comes at once, not after the running request (${r.busy_ms} ms)`);
  assert.equal(r.ran, r.queued[0], 'the running request is not disturbed');
  assert.equal(r.next, r.queued[0], 'once idle the engine answers');
});

test('a download cut mid-file or a short file leaves nothing in Cache Storage, and a retry loads', { timeout: 300_000 }, async () => {
  const page = await freshPage('network');
  const sha = createHash('sha256').update(readFileSync(MODEL)).digest('hex');
  const attempt = () => page.evaluate(async (model) => {
    try {
      const e = await m.createEngine({ model, engine: 'cpu' });
      const r = await e.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2, temperature: 0 });
      await e.unload();
      return { ok: true, fromCache: e.info.from_cache, tokens: r.usage.completion_tokens };
    } catch (e) { return { code: e.code, message: e.message }; }
  }, URL_PATH);
  // Cut after 20 MB of the 98 MB file (the header and the first tensors have loaded).
  srv.faults.set(URL_PATH, { mode: 'destroy', cutAfter: 20_000_000, times: 1 });
  const cut = await attempt();
  const afterCut = await page.evaluate(CACHE_KEYS);
  srv.faults.set(URL_PATH, { mode: 'truncate', cutAfter: 20_000_000, times: 1 });
  const short = await attempt();
  const afterShort = await page.evaluate(CACHE_KEYS);
  const retry = await attempt();
  const cached = await page.evaluate(() => m.cachedFiles());
  console.log(JSON.stringify({ cut, short, retry }));
  assert.equal(cut.code, 'NetworkError', cut.message);
  assert.deepEqual(afterCut, { files: [], metas: [] }, 'no partial copy after a cut download');
  assert.equal(short.code, 'BadModelFile', short.message);
  assert.deepEqual(afterShort, { files: [], metas: [] }, 'a file that did not load is not cached');
  assert.deepEqual(retry, { ok: true, fromCache: false, tokens: 2 });
  assert.deepEqual(cached.map((c) => [new URL(c.url).pathname, c.sha256]), [[URL_PATH, sha]]);
});

test('a cached copy that is corrupt or does not parse is dropped, fetched again and re-cached', { timeout: 300_000 }, async () => {
  const page = await freshPage('corrupt');
  const sha = createHash('sha256').update(readFileSync(MODEL)).digest('hex');
  const drafterSha = {
    config: createHash('sha256').update(readFileSync(join(DRAFTER, 'config.json'))).digest('hex'),
    weights: createHash('sha256').update(readFileSync(join(DRAFTER, 'model.safetensors'))).digest('hex'),
  };
  const r = await page.evaluate(async ({ model, drafterSha }) => {
    const url = new URL(model, location.href).href;
    const load = async () => {
      try {
        const e = await m.createEngine({ model, engine: 'cpu' });
        const r = await e.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2, temperature: 0 });
        await e.unload();
        return { fromCache: e.info.from_cache, sha: e.info.sha256, tokens: r.usage.completion_tokens };
      } catch (e) { return { code: e.code, message: e.message }; }
    };
    const garbage = new Uint8Array(1 << 20).map((_, i) => (i * 7919) % 251);
    const hex = async (b) => [...new Uint8Array(await crypto.subtle.digest('SHA-256', b))].map((x) => x.toString(16).padStart(2, '0')).join('');
    const { CACHE, META } = await import('/pkg/protocol.js');
    const [files, metas] = [await caches.open(CACHE), await caches.open(META)];
    const meta = async () => (await metas.match(url))?.json();
    const first = await load();
    const good = await meta();
    // 1. One byte of the tensor data flipped, length and meta kept: the file still
    // parses, only its sha256 differs (CacheCorrupt, then the network).
    const flipped = new Uint8Array(await (await files.match(url)).arrayBuffer());
    flipped[flipped.length - 1000] ^= 0x5a;
    await files.put(url, new Response(flipped));
    const wrongHash = await load();
    const afterWrongHash = await meta();
    const cachedAgain = await load();
    // 2. Garbage whose meta agrees (size and sha256): only the parse can tell.
    await files.put(url, new Response(garbage));
    await metas.put(url, new Response(JSON.stringify({ ...good, size: garbage.length, sha256: await hex(garbage) })));
    const unparsable = await load();
    const afterUnparsable = await meta();
    const last = await load();
    // 3. The drafter's weights replaced by garbage of their own length whose meta agrees
    // (size and sha256): read whole, they do not parse.
    const drafter = '/drafters/smollm2-135m-instruct-dflash-b16/';
    const withDrafter = async (source = drafter) => {
      try {
        const e = await m.createEngine({ model, drafter: source, engine: 'cpu' });
        const r = await e.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2, temperature: 0, block: 4 });
        await e.unload();
        return { layers: e.info.drafter?.layers, tokens: r.usage.completion_tokens };
      } catch (e) { return { code: e.code, message: e.message }; }
    };
    const weightsUrl = new URL(drafter + 'model.safetensors', location.href).href;
    const drafterFirst = await withDrafter();
    const drafterSize = (await (await files.match(weightsUrl)).arrayBuffer()).byteLength;
    const junk = new Uint8Array(drafterSize).map((_, i) => (i * 7919) % 251);
    await files.put(weightsUrl, new Response(junk));
    const weightsMeta = await (await metas.match(weightsUrl)).json();
    await metas.put(weightsUrl, new Response(JSON.stringify({ ...weightsMeta, sha256: await hex(junk) })));
    const drafterAgain = await withDrafter();
    const drafterRecached = (await (await files.match(weightsUrl)).arrayBuffer()).byteLength;
    // 4. One byte of the cached weights flipped (they still parse): the sha256 stored
    // with the copy tells, and the file is fetched again.
    const weights = new Uint8Array(await (await files.match(weightsUrl)).arrayBuffer());
    weights[weights.length - 100] ^= 0x5a;
    await files.put(weightsUrl, new Response(weights));
    const drafterFlipped = await withDrafter();
    const weightsSha = await hex(await (await files.match(weightsUrl)).arrayBuffer());
    const storedSha = (await (await metas.match(weightsUrl)).json()).sha256;
    // 5. Pinned hashes: the right ones load; a wrong one is IntegrityError, not cached.
    const pinned = await withDrafter({ url: drafter, sha256: drafterSha });
    const wrongPin = await withDrafter({ url: drafter, sha256: { weights: '00'.repeat(32) } });
    const afterWrongPin = !!(await files.match(weightsUrl)) || !!(await metas.match(weightsUrl));
    return {
      first, good, wrongHash, afterWrongHash, cachedAgain, unparsable, afterUnparsable, last, drafterFirst, drafterSize,
      drafterAgain, drafterRecached, drafterFlipped, weightsSha, storedSha, pinned, wrongPin, afterWrongPin,
    };
  }, { model: URL_PATH, drafterSha });
  console.log(JSON.stringify(r));
  const fromNetwork = { fromCache: false, sha, tokens: 2 };
  const fromCache = { fromCache: true, sha, tokens: 2 };
  assert.deepEqual(r.first, fromNetwork);
  assert.equal(r.good.sha256, sha);
  assert.deepEqual(r.wrongHash, fromNetwork, 'a copy whose hash changed is fetched again');
  assert.deepEqual([r.afterWrongHash.sha256, r.afterWrongHash.size], [sha, r.good.size], 're-cached');
  assert.deepEqual(r.cachedAgain, fromCache, 'the new copy is good');
  assert.deepEqual(r.unparsable, fromNetwork, 'a copy that does not parse is fetched again');
  assert.deepEqual([r.afterUnparsable.sha256, r.afterUnparsable.size], [sha, r.good.size], 're-cached');
  assert.deepEqual(r.last, fromCache);
  assert.equal(r.drafterFirst.tokens, 2, JSON.stringify(r.drafterFirst));
  assert.ok(r.drafterFirst.layers > 0);
  assert.deepEqual(r.drafterAgain, r.drafterFirst, 'a cached drafter that does not parse is fetched again');
  assert.equal(r.drafterRecached, r.drafterSize, 'and re-cached whole');
  assert.deepEqual(r.drafterFlipped, r.drafterFirst, 'a cached drafter whose hash changed is fetched again');
  assert.equal(r.weightsSha, drafterSha.weights, 'and re-cached as it is');
  assert.equal(r.storedSha, drafterSha.weights, 'with its sha256');
  assert.deepEqual(r.pinned, r.drafterFirst, 'pinned hashes that agree load');
  assert.equal(r.wrongPin.code, 'IntegrityError', JSON.stringify(r.wrongPin));
  assert.equal(r.afterWrongPin, false, 'a drafter file that fails its pin is not kept');
});

test('a lost GPU device is DeviceLost, and a new engine loads and answers', { timeout: 600_000 }, async () => {
  const page = await freshPage('device');
  const r = await page.evaluate(async (model) => {
    const req = { messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2, temperature: 0 };
    const engine = await m.createEngine({ model, engine: 'gpu' });
    const ok = (await engine.chat.completions.create(req)).usage.completion_tokens;
    await engine.__testLoseDevice();
    const lost = await engine.chat.completions.create(req).then(() => null, (e) => ({ code: e.code, message: e.message }));
    const lostStream = await (async () => { try { for await (const _ of engine.chat.completions.create({ ...req, stream: true })); return null; } catch (e) { return e.code; } })();
    await engine.unload();
    const again = await m.createEngine({ model, engine: 'gpu' });
    const r = await again.chat.completions.create(req);
    await again.unload();
    return { engine: engine.info.engine, ok, lost, lostStream, again: again.info.engine, tokens: r.usage.completion_tokens };
  }, URL_PATH);
  console.log(JSON.stringify(r));
  assert.equal(r.engine, 'gpu');
  assert.equal(r.ok, 2);
  assert.equal(r.lost?.code, 'DeviceLost', JSON.stringify(r.lost));
  assert.equal(r.lostStream, 'DeviceLost');
  assert.deepEqual([r.again, r.tokens], ['gpu', 2]);
});
