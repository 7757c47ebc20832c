// dflash-web: a language model on the user's GPU through WebGPU, with DFlash
// speculative decoding. The engine runs in a dedicated Web Worker; this module is the
// main-thread API with the shape of OpenAI's client: engine.chat.completions.create().

const CACHE = 'dflash-web-v1';
const META = 'dflash-web-meta-v1';

/** Every failure of the API: `code` is one of the names listed in index.d.ts. */
export class DFlashError extends Error {
  constructor(code, message) {
    super(message);
    this.name = 'DFlashError';
    this.code = code;
  }
}

/** Whether this browser exposes WebGPU at all. */
export function hasWebGPU() {
  return typeof navigator !== 'undefined' && !!navigator.gpu;
}

function absolute(src) {
  if (typeof src === 'string' || src instanceof URL) return new URL(String(src), globalThis.location?.href).href;
  return src; // File / Blob: structured-cloned to the worker
}

function modelSource(model) {
  if (model && typeof model === 'object' && !(model instanceof Blob) && !(model instanceof URL)) {
    return { src: absolute(model.url ?? model.file), sha256: model.sha256 };
  }
  return { src: absolute(model) };
}

/** A drafter folder URL (".../config.json" and ".../model.safetensors" inside it, as on
 *  the Hugging Face hub: ".../resolve/main/") or { config, weights } URLs / Files. */
function drafterSource(d) {
  if (!d) return null;
  if (typeof d === 'string' || d instanceof URL) {
    const base = absolute(d).replace(/\/?$/, '/');
    return { config: base + 'config.json', weights: base + 'model.safetensors' };
  }
  return { config: absolute(d.config), weights: absolute(d.weights) };
}

class Rpc {
  constructor(worker) {
    this.worker = worker;
    this.next = 1;
    this.pending = new Map();
    worker.onmessage = (e) => {
      const m = e.data;
      const p = this.pending.get(m.id);
      if (!p) return;
      if (m.type === 'progress') p.onProgress?.(m.progress);
      else if (m.type === 'piece') p.onPiece?.(m.text, m.drafted);
      else {
        this.pending.delete(m.id);
        if (m.type === 'error') p.reject(new DFlashError(m.error.code, m.error.message));
        else p.resolve(m.result);
      }
    };
    worker.onerror = (e) => {
      for (const p of this.pending.values()) p.reject(new DFlashError('WorkerError', e.message ?? 'the worker failed'));
      this.pending.clear();
    };
  }
  call(msg, handlers = {}) {
    const id = this.next++;
    const p = new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, ...handlers });
      this.worker.postMessage({ ...msg, id });
    });
    p.id = id;
    return p;
  }
  /** A message with no answer (the worker handles it at once, outside the queue). */
  post(msg) {
    this.worker.postMessage(msg);
  }
}

const aborted = () => new DFlashError('Aborted', 'the request was aborted');

let completionCounter = 0;

class Completions {
  constructor(engine) {
    this.engine = engine;
  }
  /** OpenAI's chat.completions.create: a completion, or with `stream: true` an async
   *  iterable of chunks (the last one carries finish_reason and usage). `options.signal`
   *  (an AbortSignal) aborts the request: it rejects (or the stream throws) with code
   *  `Aborted` and the worker stops generating it within one step. */
  create(request, options = {}) {
    const e = this.engine;
    if (!e.rpc) return Promise.reject(new DFlashError('Unloaded', 'the engine was unloaded'));
    const { signal } = options ?? {};
    if (signal?.aborted) return Promise.reject(aborted());
    const id = `chatcmpl-dflash-${Date.now().toString(36)}-${++completionCounter}`;
    const created = Math.floor(Date.now() / 1000);
    const model = e.modelName;
    const { stream, ...req } = request;
    // Tells the worker to stop this request (running or still queued).
    const abortIn = (call) => {
      if (!signal) return () => {};
      const stop = () => e.rpc?.post({ type: 'interrupt', target: call.id });
      signal.addEventListener('abort', stop, { once: true });
      return () => signal.removeEventListener('abort', stop);
    };
    if (!stream) {
      const call = e.rpc.call({ type: 'chat', request: req });
      const done = abortIn(call);
      return new Promise((resolve, reject) => {
        signal?.addEventListener('abort', () => reject(aborted()), { once: true });
        call.then((r) => resolve({
          id, object: 'chat.completion', created, model,
          choices: [{ index: 0, message: { role: 'assistant', content: r.text }, finish_reason: r.finish_reason }],
          usage: r.usage,
        }), reject).finally(done);
      });
    }
    const chunks = [];
    let wake = null;
    let finished = false;
    let failure = null;
    const chunk = (delta, finish_reason = null, extra = {}) => ({
      id, object: 'chat.completion.chunk', created, model, choices: [{ index: 0, delta, finish_reason }], ...extra,
    });
    chunks.push(chunk({ role: 'assistant', content: '' }));
    const push = (c) => { chunks.push(c); wake?.(); };
    const call = e.rpc.call({ type: 'chat', request: req }, {
      onPiece: (text, drafted) => { if (!failure) push(chunk({ content: text }, null, { dflash: { drafted } })); },
    });
    const done = abortIn(call);
    signal?.addEventListener('abort', () => { failure = aborted(); finished = true; chunks.length = 0; wake?.(); }, { once: true });
    call.then(
      (r) => { if (!failure) push(chunk({}, r.finish_reason, { usage: r.usage })); finished = true; wake?.(); },
      (err) => { failure ??= err; finished = true; wake?.(); },
    ).finally(done);
    return {
      async *[Symbol.asyncIterator]() {
        for (;;) {
          if (chunks.length) { yield chunks.shift(); continue; }
          if (failure) throw failure;
          if (finished) return;
          await new Promise((r) => { wake = r; });
          wake = null;
        }
      },
    };
  }
}

class Engine {
  constructor(rpc, info, modelName) {
    this.rpc = rpc;
    this.info = info;
    this.modelName = modelName;
    this.chat = { completions: new Completions(this) };
  }
  /** Ends the running request before its next token (within one step of DFlash): it
   *  resolves with the text so far and finish_reason 'abort'; the engine stays usable. */
  interrupt() {
    this.rpc?.post({ type: 'interrupt' });
  }
  /** Frees the GPU memory and stops the worker. */
  async unload() {
    if (!this.rpc) return;
    const rpc = this.rpc;
    this.rpc = null;
    try { await rpc.call({ type: 'unload' }); } finally { rpc.worker.terminate(); }
  }
}

/** The most threads the CPU engine takes (each is a Web Worker sharing the wasm memory). */
const MAX_THREADS = 64;

/** Loads a model (GGUF, a URL or a File) and optionally a DFlash drafter into a worker. */
export async function createEngine(options) {
  const { model, drafter, onProgress, context, worker, engine = 'auto', threads } = options ?? {};
  if (!['auto', 'gpu', 'cpu'].includes(engine)) throw new DFlashError('BadRequest', `engine must be 'auto', 'gpu' or 'cpu', not ${JSON.stringify(engine)}`);
  if (threads !== undefined && !(Number.isInteger(threads) && threads >= 1 && threads <= MAX_THREADS)) {
    throw new DFlashError('BadRequest', `threads must be an integer from 1 to ${MAX_THREADS}, not ${JSON.stringify(threads)}`);
  }
  if (engine === 'gpu' && !hasWebGPU()) throw new DFlashError('NoWebGPU', 'This browser does not support WebGPU (navigator.gpu is missing).');
  if (!model) throw new DFlashError('BadRequest', 'createEngine needs { model }');
  const w = worker ?? new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
  const rpc = new Rpc(w);
  const src = modelSource(model);
  try {
    const info = await rpc.call({ type: 'load', model: src, drafter: drafterSource(drafter), context, engine, threads }, { onProgress });
    const name = typeof src.src === 'string' ? src.src.split('/').pop() : src.src.name ?? 'model';
    return new Engine(rpc, info, name);
  } catch (e) {
    w.terminate();
    throw e;
  }
}

/** The files in the weight cache: [{ url, size, sha256 }]. */
export async function cachedFiles() {
  if (!globalThis.caches) return [];
  const [cache, metas] = [await caches.open(CACHE), await caches.open(META)];
  const out = [];
  for (const req of await metas.keys()) {
    if (!(await cache.match(req))) continue;
    const m = await (await metas.match(req)).json();
    out.push({ url: m.url, size: m.size, sha256: m.sha256 });
  }
  return out;
}

/** Removes every cached weight file (or only `url`). */
export async function clearCache(url) {
  if (!globalThis.caches) return;
  if (!url) { await caches.delete(CACHE); await caches.delete(META); return; }
  const abs = new URL(String(url), globalThis.location?.href).href;
  await (await caches.open(CACHE)).delete(abs);
  await (await caches.open(META)).delete(abs);
}
