// The dflash-web engine in a dedicated Web Worker. The main thread (index.js) posts
// requests; this worker fetches the weights in chunks (from Cache Storage when cached,
// else the network, writing them to the cache as they pass), streams every chunk into
// the wasm loader (each tensor goes to the GPU, or into the CPU engine's quantized
// weights, as soon as it is complete, so the file is never whole in memory), checks the
// sha256, then answers chat requests one at a time, posting text pieces as they come.
// A panic in the wasm traps the instance for good: the worker then answers only with a
// 'fatal' message carrying the panic's text, and the main thread replaces it.

import { CACHE, META, MSG, CODE } from './protocol.js';

// Two builds of the engine: dist/ (one thread) and dist/threads/ (atomics and shared
// memory: the CPU engine on a pool of Web Workers), which needs SharedArrayBuffer, that
// is a cross-origin isolated page. Each is loaded on first use.
const builds = {};
// The loaded modules, to read a panic's message from after a trap.
const loaded = [];

async function wasmBuild(threads) {
  const key = threads > 1 ? 'threads' : 'single';
  builds[key] ??= (async () => {
    if (key === 'single') {
      const mod = await import('./dist/dflash_web.js');
      await mod.default({ module_or_path: new URL('./dist/dflash_web_bg.wasm', import.meta.url) });
      loaded.push(mod);
      return { mod, threads: 1 };
    }
    const mod = await import('./dist/threads/dflash_web.js');
    await mod.default({ module_or_path: new URL('./dist/threads/dflash_web_bg.wasm', import.meta.url) });
    await mod.initThreadPool(threads);
    loaded.push(mod);
    return { mod, threads };
  })();
  return builds[key];
}

/** The CPU engine's threads: as asked (default: the cores, at most 8), 1 without isolation. */
function cpuThreads(asked) {
  if (!self.crossOriginIsolated || typeof SharedArrayBuffer === 'undefined') return 1;
  return asked ?? Math.min(self.navigator?.hardwareConcurrency || 1, 8);
}

let engine = null;
let queue = Promise.resolve();

class WorkerError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

// The request being answered, and queued requests aborted before they started.
let running = null;
// The fault tests' hooks are only in a package built with DFLASH_TEST_HOOKS=1.
function noTestHooks() {
  return new WorkerError(CODE.BadRequest, 'this build has no test hooks (DFLASH_TEST_HOOKS=1 scripts/build-pkg.sh)');
}

const dropped = new Set();
// The message being handled (any type): the one a trap is charged to.
let current = null;
// Set once the wasm trapped: nothing more is handled.
let dead = false;

/** A wasm trap (a Rust panic is `unreachable`): the instance must not be used again. */
function isTrap(err) {
  return typeof WebAssembly !== 'undefined' && err instanceof WebAssembly.RuntimeError;
}

/** Reports a trap once, with the panic's own message where the hook stored one. */
function fatal(err) {
  if (dead) return;
  dead = true;
  let panic = null;
  for (const mod of loaded) {
    try { panic ??= mod.takePanic(); } catch { /* the instance may be past reading */ }
  }
  post({ type: MSG.fatal, id: current, error: { code: CODE.Panic, message: panic ?? `the engine trapped: ${err.message ?? err}` } });
}

// A trap inside a running future (a chat request) surfaces here, not in its promise,
// which never settles.
self.addEventListener('error', (e) => { if (isTrap(e.error)) { e.preventDefault(); fatal(e.error); } });
self.addEventListener('unhandledrejection', (e) => { if (isTrap(e.reason)) { e.preventDefault(); fatal(e.reason); } });

self.onmessage = (e) => {
  const m = e.data;
  if (dead) return;
  // An interrupt acts now, not after the request it interrupts.
  if (m.type === MSG.interrupt) {
    if (m.target === undefined || m.target === running) engine?.interrupt();
    else dropped.add(m.target);
    return;
  }
  queue = queue.then(() => handle(m));
};

function post(msg) {
  self.postMessage(msg);
}

async function handle(m) {
  if (dead) return;
  current = m.id;
  try {
    if (m.type === MSG.load) {
      engine?.unload();
      engine = null;
      engine = await load(m, (p) => post({ id: m.id, type: MSG.progress, progress: p }));
      post({ id: m.id, type: MSG.result, result: engine.info() });
    } else if (m.type === MSG.chat) {
      if (!engine) throw new WorkerError(CODE.Unloaded, 'no model is loaded');
      if (dropped.delete(m.id)) throw new WorkerError(CODE.Aborted, 'the request was aborted before it started');
      running = m.id;
      try {
        const onChunk = m.stream ? (chunk) => post({ id: m.id, type: MSG.piece, chunk }) : undefined;
        const result = await engine.chat(m.request, m.envelope, onChunk);
        post({ id: m.id, type: MSG.result, result });
      } finally {
        running = null;
      }
    } else if (m.type === MSG.plan) {
      const engine = await chooseEngine(m.engine ?? 'auto');
      const { mod } = await wasmBuild(1);
      post({ id: m.id, type: MSG.result, result: await checkPlan(mod, engine, m.plan, m.context ?? 2048) });
    } else if (m.type === MSG.benchSynthetic) {
      // The wasm CPU engine on the worker's threads (no model, no adapter).
      const { mod, threads } = await wasmBuild(cpuThreads(m.threads));
      const report = mod.benchSynthetic(m.options);
      post({ id: m.id, type: MSG.result, result: { ...report, wasm_threads: threads } });
    } else if (m.type === MSG.resetChat) {
      if (!engine) throw new WorkerError(CODE.Unloaded, 'no model is loaded');
      engine.resetChat();
      post({ id: m.id, type: MSG.result, result: null });
    } else if (m.type === MSG.unload) {
      engine?.unload();
      engine = null;
      post({ id: m.id, type: MSG.result, result: null });
    } else if (m.type === MSG.testTrap) {
      // TEST ONLY: a panic inside a running wasm future.
      const mod = engine?.mod ?? (await wasmBuild(1)).mod;
      if (typeof mod.__testTrap !== 'function') throw noTestHooks();
      await mod.__testTrap(m.message);
    } else if (m.type === MSG.testPoolPanic) {
      // TEST ONLY: a panic on a pool thread; this thread blocks waiting for it.
      const mod = engine?.mod;
      if (typeof mod?.__testPoolPanic !== 'function') throw noTestHooks();
      mod.__testPoolPanic(m.message);
    } else if (m.type === MSG.testLoseDevice) {
      // TEST ONLY: GPUDevice.destroy() on the engine's device.
      if (!engine) throw new WorkerError(CODE.Unloaded, 'no model is loaded');
      if (!engine.loseDevice) throw noTestHooks();
      engine.loseDevice();
      post({ id: m.id, type: MSG.result, result: null });
    } else {
      throw new WorkerError(CODE.BadRequest, `unknown request ${m.type}`);
    }
  } catch (err) {
    if (isTrap(err)) return fatal(err);
    post({ id: m.id, type: MSG.error, error: { code: err?.code ?? CODE.Error, message: String(err?.message ?? err) } });
  } finally {
    current = null;
  }
}

// --- sources: a URL (cached) or a File/Blob ---------------------------------------

async function openCaches() {
  try {
    return self.caches ? [await caches.open(CACHE), await caches.open(META)] : [null, null];
  } catch {
    return [null, null]; // Cache Storage refused (opaque origin, private mode): load without it
  }
}

const noCache = { finishCache: async () => {}, dropCache: async () => {} };
/** Errors that mean the file itself is bad: a copy that gave one is never kept. */
const FILE_FAULTS = [CODE.BadModelFile, CODE.CacheCorrupt, CODE.IntegrityError, CODE.NetworkError];

/**
 * { size, reader, cached, finishCache(sha256), dropCache() } for one file. A network
 * copy is written to the cache as it is read, but counts only once `finishCache` writes
 * its meta entry (after the file has loaded); `dropCache` removes both entries.
 */
async function openSource(src, phase) {
  if (typeof Blob !== 'undefined' && src instanceof Blob) {
    return { size: src.size, reader: src.stream().getReader(), cached: false, ...noCache };
  }
  const url = String(src);
  if (!/^https?:/i.test(url)) return smallUrlSource(url);
  const [cache, metas] = await openCaches();
  if (cache) {
    const hit = await cache.match(url);
    const meta = await metas.match(url);
    if (hit && meta) {
      const m = await meta.json();
      const reader = hit.body.getReader();
      return {
        size: m.size, cached: true, expectedSha: m.sha256,
        // A copy cached before its sha256 was stored gets it once it has loaded.
        finishCache: async (sha256) => { if (!m.sha256 && sha256) await metas.put(url, new Response(JSON.stringify({ ...m, sha256 }))); },
        // A cached copy that cannot be read is as corrupt as one that does not parse.
        reader: {
          read: () => reader.read().catch((e) => { throw new WorkerError(CODE.CacheCorrupt, `reading the cached ${phase}: ${e.message ?? e}`); }),
          cancel: (e) => reader.cancel(e).catch(() => {}),
        },
        dropCache: async () => { await cache.delete(url); await metas.delete(url); },
      };
    }
  }
  let resp;
  try {
    resp = await fetch(url);
  } catch (e) {
    throw new WorkerError(CODE.NetworkError, `fetching ${url}: ${e.message ?? e}`);
  }
  if (!resp.ok) throw new WorkerError(CODE.NetworkError, `fetching ${url}: HTTP ${resp.status}`);
  const size = Number(resp.headers.get('content-length'));
  if (!size) throw new WorkerError(CODE.NetworkError, `${url}: the server sent no Content-Length`);
  const reader = resp.body.getReader();
  if (!cache) return { size, reader: checkedLength(reader, url, size, null), cached: false, ...noCache };
  // The cache copy is written in step with the read (no tee buffering a whole file).
  // A copy the cache refuses (over its quota, say) is given up, not the load.
  const ts = new TransformStream();
  const copy = { writer: ts.writable.getWriter(), failed: false };
  const put = cache.put(url, new Response(ts.readable, { headers: { 'content-length': String(size) } }))
    .then(() => true, () => { copy.failed = true; return false; });
  const wrapped = checkedLength(reader, url, size, copy);
  return {
    size, reader: wrapped, cached: false,
    // The meta entry only for a copy the cache took whole.
    finishCache: async (sha256) => {
      if (await put) await metas.put(url, new Response(JSON.stringify({ size, sha256, url, phase })));
    },
    // A failed put (its stream aborted) stores nothing; a finished one is deleted.
    dropCache: async () => { wrapped.cancel(); await put; await cache.delete(url); await metas.delete(url); },
  };
}

/** A data: or blob: URL (a bundler inlines small assets as data: URLs): read whole,
 *  never cached (Cache Storage keeps http(s) only). */
async function smallUrlSource(url) {
  let blob;
  try {
    const resp = await fetch(url);
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    blob = await resp.blob();
  } catch (e) {
    throw new WorkerError(CODE.NetworkError, `fetching ${url.slice(0, 64)}: ${e.message ?? e}`);
  }
  return { size: blob.size, reader: blob.stream().getReader(), cached: false, ...noCache };
}

/**
 * `reader` of a `size`-byte body whose bytes also go to `copy.writer` (the cache copy,
 * while `copy.failed` is false): a body that fails, ends short or runs long is a
 * NetworkError and aborts the copy, so that no partial file is ever stored; a copy that
 * fails only stops being written.
 */
function checkedLength(reader, url, size, copy) {
  let got = 0;
  const writer = copy?.writer;
  const failedCopy = () => { copy.failed = true; };
  const fail = (why) => {
    writer?.abort(why).catch(() => {});
    reader.cancel(why).catch(() => {});
    return new WorkerError(CODE.NetworkError, `fetching ${url}: ${why}`);
  };
  return {
    async read() {
      let r;
      try {
        r = await reader.read();
      } catch (e) {
        throw fail(e.message ?? String(e));
      }
      if (r.done) {
        if (got !== size) throw fail(`the body ended after ${got} of ${size} bytes`);
        if (copy && !copy.failed) await writer.close().catch(failedCopy);
        return r;
      }
      got += r.value.length;
      if (got > size) throw fail(`the body is longer than its ${size} bytes`);
      if (copy && !copy.failed) {
        try {
          await writer.ready;
          writer.write(r.value).catch(failedCopy);
        } catch {
          failedCopy();
        }
      }
      return r;
    },
    cancel: (e) => { writer?.abort(e).catch(() => {}); return reader.cancel(e).catch(() => {}); },
  };
}

/** A whole small file: { bytes, cached, finishCache, dropCache }. */
async function readAll(src, name, onProgress) {
  const s = await openSource(src, name);
  const out = new Uint8Array(s.size);
  let off = 0;
  try {
    for (;;) {
      const { done, value } = await s.reader.read();
      if (done) break;
      if (off + value.length > out.length) throw new WorkerError(CODE.BadModelFile, `${name} is longer than announced`);
      out.set(value, off);
      off += value.length;
      onProgress({ phase: s.cached ? 'cache' : 'download', file: name, loaded: off, total: s.size });
    }
    if (off !== s.size) throw new WorkerError(CODE.BadModelFile, `${name}: got ${off} of ${s.size} bytes`);
  } catch (e) {
    const fault = FILE_FAULTS.includes(e.code);
    if (!s.cached || fault) await s.dropCache();
    e.retry = s.cached && fault;
    throw e;
  }
  const file = {
    bytes: out, cached: s.cached, expectedSha: s.expectedSha, sha: null,
    finishCache: () => s.finishCache(file.sha), dropCache: s.dropCache,
  };
  return file;
}

/** Checks a whole file's sha256 (`mod.sha256Hex`) against the one stored with its cached
 *  copy (CacheCorrupt: fetched again) and the one the page pinned (IntegrityError);
 *  keeps it on `file` for the cache's meta entry. */
async function checkSha(mod, file, name, pinned) {
  // Web Crypto where the page is a secure context (no copy into the wasm memory), else
  // the engine's own sha2.
  const subtle = globalThis.crypto?.subtle;
  file.sha = subtle
    ? [...new Uint8Array(await subtle.digest('SHA-256', file.bytes))].map((b) => b.toString(16).padStart(2, '0')).join('')
    : mod.sha256Hex(file.bytes);
  if (file.cached && file.expectedSha && file.expectedSha !== file.sha) {
    const e = new WorkerError(CODE.CacheCorrupt, `cached ${name} sha256 is ${file.sha}, stored ${file.expectedSha}`);
    e.retry = true;
    throw e;
  }
  if (pinned && pinned.toLowerCase() !== file.sha) {
    const e = new WorkerError(CODE.IntegrityError, `${name} sha256 is ${file.sha}, expected ${pinned}`);
    e.retry = file.cached; // a cached copy may be an older version: the network may have the pinned one
    throw e;
  }
}

// --- loading ---------------------------------------------------------------------

/**
 * The engine to ask the wasm loader for: 'gpu' or 'cpu' as asked; for 'auto', 'cpu'
 * where there is no WebGPU adapter or only a software fallback (SwiftShader and the
 * like run the GPU engine slower than the CPU engine runs on the same cores), else
 * 'auto' (the loader still falls back to the CPU if the device does not open).
 */
async function chooseEngine(asked) {
  if (asked === 'gpu' || asked === 'cpu') return asked;
  const gpu = self.navigator?.gpu;
  if (!gpu) return 'cpu';
  let adapter = null;
  try { adapter = await gpu.requestAdapter(); } catch { adapter = null; }
  if (!adapter) return 'cpu';
  const info = adapter.info ?? {};
  const software = adapter.isFallbackAdapter || info.isFallbackAdapter
    || /swiftshader|llvmpipe|lavapipe|software/i.test(`${info.vendor} ${info.architecture} ${info.device} ${info.description}`);
  return software ? 'cpu' : 'auto';
}

/**
 * The model streamed into a new loader, part after part (a model split by llama.cpp's
 * gguf-split comes as several files): { loader, source }, where `source` commits or
 * drops every part's cache copy at once. Each part's sha256 is checked against its
 * cached copy's and the pinned one as soon as it has arrived.
 */
async function streamModel(mod, m, engine, onProgress) {
  const parts = m.model.parts;
  const sources = [];
  const shas = [];
  let loader = null;
  let s = null;
  try {
    for (const [i, part] of parts.entries()) {
      s = null; // the part that fails, if this one does (a part before it has loaded)
      s = await openSource(part.src, parts.length > 1 ? `model part ${i + 1} of ${parts.length}` : 'model');
      sources.push(s);
      if (i === 0) loader = await mod.Loader.open(s.size, engine, m.context ?? 2048);
      else loader.nextPart(s.size);
      await streamPart(loader, s, (loaded) => onProgress({
        phase: s.cached ? 'cache' : 'download', file: 'model', part: i + 1, parts: parts.length, loaded, total: s.size,
      }), i === 0 ? () => checkPartCount(loader, parts.length) : null);
      const sha = loader.sha256();
      const what = parts.length > 1 ? `model part ${i + 1}` : 'model';
      if (s.cached && s.expectedSha !== sha) {
        throw new WorkerError(CODE.CacheCorrupt, `cached ${what} sha256 is ${sha}, stored ${s.expectedSha}`);
      }
      if (part.sha256 && part.sha256.toLowerCase() !== sha) {
        throw new WorkerError(CODE.IntegrityError, `${what} sha256 is ${sha}, expected ${part.sha256}`);
      }
      shas.push(sha);
    }
    return { loader, sha: shas[0], source: allParts(sources, shas) };
  } catch (e) {
    s?.reader.cancel?.(e);
    loader?.free();
    if (isTrap(e)) throw e;
    // A network copy is incomplete here, never kept; a cached one goes if it is at
    // fault. The parts before it loaded: they are good.
    const fault = FILE_FAULTS.includes(e.code);
    if (s && (!s.cached || fault)) await s.dropCache();
    for (const [i, done] of sources.slice(0, shas.length).entries()) await done.finishCache(shas[i]);
    e.retry = !!s?.cached && fault;
    throw e;
  }
}

/** Once the first header has arrived: the model has as many parts as were given (else
 *  BadRequest at once, before the rest downloads). True once checked. */
function checkPartCount(loader, given) {
  const count = loader.parts();
  if (count === undefined || count === null) return false;
  if (count !== given) {
    throw new WorkerError(CODE.BadRequest, `the model is split in ${count} parts (gguf-split), ${given} given: name its first part's URL alone, or list every part in { parts }`);
  }
  return true;
}

/** One file's chunks into the loader; `onLoaded(bytes)` at most every 100 ms; `check()`
 *  after each chunk until it returns true. */
async function streamPart(loader, s, onLoaded, check) {
  let loaded = 0;
  let last = 0;
  for (;;) {
    const { done, value } = await s.reader.read();
    if (done) return;
    loader.push(value);
    if (check?.()) check = null;
    loaded += value.length;
    const now = performance.now();
    if (now - last > 100 || loaded === s.size) {
      last = now;
      onLoaded(loaded);
    }
  }
}

/** The parts' sources as one: cached when every part came from the cache. */
function allParts(sources, shas) {
  return {
    cached: sources.every((x) => x.cached),
    finishCache: async () => { for (const [i, x] of sources.entries()) await x.finishCache(shas[i]); },
    dropCache: async () => { for (const x of sources) await x.dropCache(); },
  };
}

/** The drafter's files set on `loader`: config and weights, then its draft vocabulary
 *  where it has one. A pair that does not load leaves neither file cached, and a cached
 *  pair that is corrupt or does not parse is fetched once more; the vocabulary the same
 *  on its own (a pair that loaded stays cached whatever its vocabulary does). Returns the
 *  files' sources, committed after the load. */
async function setDrafter(mod, loader, d, onProgress) {
  const pair = await setDrafterPair(mod, loader, d, onProgress);
  if (!d.draftVocab) return pair;
  try {
    return [...pair, await setDraftVocab(mod, loader, d, onProgress)];
  } catch (e) {
    if (!isTrap(e)) for (const f of pair) await f.finishCache();
    throw e;
  }
}

async function setDrafterPair(mod, loader, d, onProgress) {
  for (let attempt = 0; ; attempt++) {
    const files = [];
    try {
      files.push(await readAll(d.config, 'drafter config', onProgress));
      await checkSha(mod, files[0], 'drafter config', d.sha256?.config);
      files.push(await readAll(d.weights, 'drafter weights', onProgress));
      await checkSha(mod, files[1], 'drafter weights', d.sha256?.weights);
      loader.setDrafter(new TextDecoder().decode(files[0].bytes), files[1].bytes);
      return files;
    } catch (e) {
      if (isTrap(e)) throw e;
      for (const f of files) await f.dropCache();
      const unparsable = files.length === 2 && e.code === CODE.BadModelFile && files.some((f) => f.cached);
      if (attempt > 0 || !(e.retry || unparsable)) throw e;
    }
  }
}

async function setDraftVocab(mod, loader, d, onProgress) {
  for (let attempt = 0; ; attempt++) {
    let file = null;
    try {
      file = await readAll(d.draftVocab, 'drafter vocab', onProgress);
      await checkSha(mod, file, 'drafter vocab', d.sha256?.draftVocab);
      loader.setDraftVocab(new TextDecoder().decode(file.bytes));
      return file;
    } catch (e) {
      if (isTrap(e)) throw e;
      await file?.dropCache();
      const unparsable = file?.cached && e.code === CODE.BadModelFile;
      if (attempt > 0 || !(e.retry || unparsable)) throw e;
    }
  }
}

/**
 * The model (and drafter) built once. A failure the model file is to blame for drops
 * its copy; `e.retry` says the copy came from the cache, so the network may do better.
 * A copy is committed to the cache only once it has loaded.
 */
async function loadOnce(mod, m, engine, onProgress) {
  const { loader, source } = await streamModel(mod, m, engine, onProgress);
  let drafter = [];
  let pending = loader;
  let building = false;
  try {
    if (m.drafter) drafter = await setDrafter(mod, loader, m.drafter, onProgress);
    onProgress({ phase: 'build', file: 'model', loaded: 0, total: 0 });
    pending = null; // finish takes the loader
    building = true;
    const eng = await loader.finish(m.context ?? 2048);
    await source.finishCache();
    for (const f of drafter) await f.finishCache();
    return { eng, cached: source.cached };
  } catch (e) {
    pending?.free();
    if (isTrap(e)) throw e;
    if (building && e.code === CODE.BadModelFile) {
      // The model's own parse failed (a drafter's fails in setDrafter).
      await source.dropCache();
      e.retry = source.cached;
    } else if (!source.cached) {
      await source.finishCache(); // the files are good; the failure is elsewhere
    }
    // The drafter's files parsed in setDrafter: they are good too.
    for (const f of drafter) await f.finishCache();
    throw e;
  }
}

/** The most a model may take on the CPU engine: its wasm memory (4 GiB), less room for
 *  the engine's own allocations. */
const CPU_ENGINE_BYTES = 3.5 * 2 ** 30;

/**
 * What a load needs, checked before anything downloads: on the GPU, the engine's memory
 * plan of the catalogue model's shape against the adapter's limits (LimitsExceeded) and
 * the budget (OutOfMemory); on the CPU engine, the files' bytes against its memory.
 * Returns { engine, download, weights, kv_cache, activations, total } (null figures
 * where nothing says).
 */
async function checkPlan(mod, engine, plan, context) {
  const none = { weights: null, kv_cache: null, activations: null, total: null };
  if (!plan) return { engine, download: null, ...none };
  if (engine === 'cpu') {
    if (plan.download !== null && plan.download > CPU_ENGINE_BYTES) {
      throw new WorkerError(CODE.LimitsExceeded, `the model's files are ${(plan.download / 2 ** 30).toFixed(1)} GiB; the CPU engine holds at most ${(CPU_ENGINE_BYTES / 2 ** 30).toFixed(1)} GiB (its wasm memory is 4 GiB)`);
    }
    return { engine, download: plan.download, ...none };
  }
  if (!plan.shape) return { engine: 'gpu', download: plan.download, ...none };
  let p;
  try {
    p = await mod.planShape(plan.shape, context, plan.dflash, plan.budget, plan.draftVocab ?? undefined);
  } catch (e) {
    // 'auto' loads on the CPU engine where no device opens.
    if (engine === 'auto' && e.code === CODE.NoWebGPU) return checkPlan(mod, 'cpu', plan, context);
    throw e;
  }
  return { engine: 'gpu', download: plan.download, ...p };
}

/**
 * The load's progress as one: each event also carries `overall` ({ loaded, total }
 * bytes over every file; a file's size counts from the catalogue, else once it opens)
 * and `text`, a line for people: which file, MB of MB, the speed, and the whole.
 */
function overallProgress(onProgress, m) {
  const key = (p) => (p.file === 'model' ? `model ${p.part ?? 1}` : p.file);
  const size = new Map();
  const got = new Map();
  const started = new Map();
  m.model.parts.forEach((p, i) => size.set(`model ${i + 1}`, p.size ?? 0));
  if (m.drafter) {
    size.set('drafter config', m.drafter.size?.config ?? 0);
    size.set('drafter weights', m.drafter.size?.weights ?? 0);
    if (m.drafter.draftVocab) size.set('drafter vocab', m.drafter.size?.draftVocab ?? 0);
  }
  const sum = (map) => [...map.values()].reduce((a, b) => a + b, 0);
  const mb = (b) => (b / 1e6).toFixed(1);
  return (p) => {
    const k = key(p);
    if (p.phase !== 'build') {
      size.set(k, p.total);
      got.set(k, p.loaded);
      if (!started.has(k)) started.set(k, performance.now());
    }
    const overall = { loaded: sum(got), total: sum(size) };
    let text = 'building the model…';
    if (p.phase !== 'build') {
      const s = (performance.now() - started.get(k)) / 1000;
      const name = p.parts > 1 ? `model part ${p.part} of ${p.parts}` : p.file;
      const speed = s > 0.2 ? `, ${mb(p.loaded / s)} MB/s` : '';
      text = `${p.phase === 'cache' ? 'reading from the cache' : 'downloading'} ${name}: ${mb(p.loaded)} of ${mb(p.total)} MB${speed}`
        + (size.size > 1 ? ` · ${mb(overall.loaded)} of ${mb(overall.total)} MB in all` : '');
    }
    onProgress({ ...p, overall, text });
  };
}

async function load(m, onProgress) {
  const t0 = performance.now();
  const engine = await chooseEngine(m.engine ?? 'auto');
  // The threaded build only where the CPU engine runs (the GPU engine gains nothing).
  const { mod } = await wasmBuild(engine === 'cpu' ? cpuThreads(m.threads) : 1);
  // A panic on a pool thread reaches the page on this channel (this thread is blocked then).
  if (m.panicChannel) mod.setPanicChannel(String(m.panicChannel));
  await checkPlan(mod, engine, m.plan, m.context ?? 2048);
  onProgress = overallProgress(onProgress, m);
  let r;
  try {
    r = await loadOnce(mod, m, engine, onProgress);
  } catch (e) {
    // A cached copy that is corrupt or does not parse is gone: once more from the network.
    if (!e.retry) throw e;
    r = await loadOnce(mod, m, engine, onProgress);
  }
  const { eng } = r;
  const info = eng.info();
  info.load_s = (performance.now() - t0) / 1000;
  info.from_cache = r.cached;
  const engineInfo = info;
  return {
    mod,
    info: () => engineInfo,
    chat: (req, envelope, onChunk) => eng.chat(req, envelope, onChunk),
    interrupt: () => eng.interrupt(),
    resetChat: () => eng.resetChat(),
    loseDevice: typeof eng.__testLoseDevice === 'function' ? () => eng.__testLoseDevice() : null,
    unload: () => { eng.unload(); eng.free(); },
  };
}
