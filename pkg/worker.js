// The dflash-web engine in a dedicated Web Worker. The main thread (index.js) posts
// requests; this worker fetches the weights in chunks (from Cache Storage when cached,
// else the network, writing them to the cache as they pass), streams every chunk into
// the wasm loader (each tensor goes to the GPU, or into the CPU engine's quantized
// weights, as soon as it is complete, so the file is never whole in memory), checks the
// sha256, then answers chat requests one at a time, posting text pieces as they come.

// Two builds of the engine: dist/ (one thread) and dist/threads/ (atomics and shared
// memory: the CPU engine on a pool of Web Workers), which needs SharedArrayBuffer, that
// is a cross-origin isolated page. Each is loaded on first use.
const builds = {};

async function wasmBuild(threads) {
  const key = threads > 1 ? 'threads' : 'single';
  builds[key] ??= (async () => {
    if (key === 'single') {
      const mod = await import('./dist/dflash_web.js');
      await mod.default({ module_or_path: new URL('./dist/dflash_web_bg.wasm', import.meta.url) });
      return { mod, threads: 1 };
    }
    const mod = await import('./dist/threads/dflash_web.js');
    await mod.default({ module_or_path: new URL('./dist/threads/dflash_web_bg.wasm', import.meta.url) });
    await mod.initThreadPool(threads);
    return { mod, threads };
  })();
  return builds[key];
}

/** The CPU engine's threads: as asked (default: the cores, at most 8), 1 without isolation. */
function cpuThreads(asked) {
  if (!self.crossOriginIsolated || typeof SharedArrayBuffer === 'undefined') return 1;
  return asked ?? Math.min(self.navigator?.hardwareConcurrency || 1, 8);
}

const CACHE = 'dflash-web-v1';
// The file's size and sha256 live in a second cache under the same URL (Cache Storage
// ignores URL fragments, so they cannot share one cache).
const META = 'dflash-web-meta-v1';
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
const dropped = new Set();

self.onmessage = (e) => {
  const m = e.data;
  // An interrupt acts now, not after the request it interrupts.
  if (m.type === 'interrupt') {
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
  try {
    if (m.type === 'load') {
      engine?.unload();
      engine = null;
      engine = await load(m, (p) => post({ id: m.id, type: 'progress', progress: p }));
      post({ id: m.id, type: 'result', result: engine.info() });
    } else if (m.type === 'chat') {
      if (!engine) throw new WorkerError('Unloaded', 'no model is loaded');
      if (dropped.delete(m.id)) throw new WorkerError('Aborted', 'the request was aborted before it started');
      running = m.id;
      try {
        const result = await engine.chat(m.request, (text, drafted) => post({ id: m.id, type: 'piece', text, drafted }));
        post({ id: m.id, type: 'result', result });
      } finally {
        running = null;
      }
    } else if (m.type === 'unload') {
      engine?.unload();
      engine = null;
      post({ id: m.id, type: 'result', result: null });
    } else {
      throw new WorkerError('BadRequest', `unknown request ${m.type}`);
    }
  } catch (err) {
    post({ id: m.id, type: 'error', error: { code: err?.code ?? 'Error', message: String(err?.message ?? err) } });
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

/** { size, reader, cached, finishCache(sha256), dropCache() } for one file. */
async function openSource(src, phase) {
  if (typeof Blob !== 'undefined' && src instanceof Blob) {
    return { size: src.size, reader: src.stream().getReader(), cached: false, finishCache: async () => {}, dropCache: async () => {} };
  }
  const url = String(src);
  const [cache, metas] = await openCaches();
  const drop = async () => { await cache.delete(url); await metas.delete(url); };
  if (cache) {
    const hit = await cache.match(url);
    const meta = await metas.match(url);
    if (hit && meta) {
      const m = await meta.json();
      return {
        size: m.size, reader: hit.body.getReader(), cached: true, expectedSha: m.sha256,
        finishCache: async () => {}, dropCache: drop,
      };
    }
  }
  let resp;
  try {
    resp = await fetch(url);
  } catch (e) {
    throw new WorkerError('NetworkError', `fetching ${url}: ${e.message ?? e}`);
  }
  if (!resp.ok) throw new WorkerError('NetworkError', `fetching ${url}: HTTP ${resp.status}`);
  const size = Number(resp.headers.get('content-length'));
  if (!size) throw new WorkerError('NetworkError', `${url}: the server sent no Content-Length`);
  const reader = resp.body.getReader();
  if (!cache) return { size, reader, cached: false, finishCache: async () => {}, dropCache: async () => {} };
  // The cache copy is written in step with the read (no tee buffering a whole file).
  const ts = new TransformStream();
  const writer = ts.writable.getWriter();
  const put = cache.put(url, new Response(ts.readable, { headers: { 'content-length': String(size) } })).catch(() => {});
  const wrapped = {
    async read() {
      const r = await reader.read();
      if (r.done) await writer.close();
      else { await writer.ready; writer.write(r.value); }
      return r;
    },
    cancel: (e) => { writer.abort(e).catch(() => {}); return reader.cancel(e); },
  };
  return {
    size, reader: wrapped, cached: false,
    finishCache: async (sha256) => {
      await put;
      await metas.put(url, new Response(JSON.stringify({ size, sha256, url, phase })));
    },
    dropCache: drop,
  };
}

async function readAll(src, name, onProgress) {
  const s = await openSource(src, name);
  const out = new Uint8Array(s.size);
  let off = 0;
  for (;;) {
    const { done, value } = await s.reader.read();
    if (done) break;
    if (off + value.length > out.length) throw new WorkerError('BadModelFile', `${name} is longer than announced`);
    out.set(value, off);
    off += value.length;
    onProgress({ phase: s.cached ? 'cache' : 'download', file: name, loaded: off, total: s.size });
  }
  if (off !== s.size) throw new WorkerError('BadModelFile', `${name}: got ${off} of ${s.size} bytes`);
  await s.finishCache(null);
  return out;
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

async function loadModelOnce(Loader, model, engine, onProgress) {
  const s = await openSource(model.src, 'model');
  const loader = await Loader.open(s.size, engine);
  let loaded = 0;
  let last = 0;
  try {
    for (;;) {
      const { done, value } = await s.reader.read();
      if (done) break;
      loader.push(value);
      loaded += value.length;
      const now = performance.now();
      if (now - last > 100 || loaded === s.size) {
        last = now;
        onProgress({ phase: s.cached ? 'cache' : 'download', file: 'model', loaded, total: s.size });
      }
    }
  } catch (e) {
    s.reader.cancel?.(e);
    loader.free();
    if (!e.code) throw new WorkerError('NetworkError', `reading the model: ${e.message ?? e}`);
    throw e;
  }
  const sha = loader.sha256();
  if (s.cached && s.expectedSha !== sha) {
    // The cached copy changed since it was stored: drop it (the caller fetches again).
    loader.free();
    await s.dropCache();
    throw new WorkerError('CacheCorrupt', `cached model sha256 is ${sha}, stored ${s.expectedSha}`);
  }
  if (model.sha256 && model.sha256.toLowerCase() !== sha) {
    loader.free();
    if (!s.cached) await s.finishCache(sha);
    await s.dropCache();
    throw new WorkerError('IntegrityError', `model sha256 is ${sha}, expected ${model.sha256}`);
  }
  await s.finishCache(sha);
  return { loader, cached: s.cached };
}

async function load(m, onProgress) {
  const t0 = performance.now();
  const engine = await chooseEngine(m.engine ?? 'auto');
  // The threaded build only where the CPU engine runs (the GPU engine gains nothing).
  const { mod } = await wasmBuild(engine === 'cpu' ? cpuThreads(m.threads) : 1);
  let r;
  try {
    r = await loadModelOnce(mod.Loader, m.model, engine, onProgress);
  } catch (e) {
    if (e.code !== 'CacheCorrupt') throw e;
    r = await loadModelOnce(mod.Loader, m.model, engine, onProgress); // the bad copy is gone: from the network
  }
  const { loader } = r;
  if (m.drafter) {
    const d = m.drafter;
    const config = new TextDecoder().decode(await readAll(d.config, 'drafter config', onProgress));
    const weights = await readAll(d.weights, 'drafter weights', onProgress);
    loader.setDrafter(config, weights);
  }
  onProgress({ phase: 'build', file: 'model', loaded: 0, total: 0 });
  const eng = loader.finish(m.context ?? 2048);
  const info = eng.info();
  info.load_s = (performance.now() - t0) / 1000;
  info.from_cache = r.cached;
  const engineInfo = info;
  return {
    info: () => engineInfo,
    chat: (req, onPiece) => eng.chat(req, onPiece),
    interrupt: () => eng.interrupt(),
    unload: () => { eng.unload(); eng.free(); },
  };
}
