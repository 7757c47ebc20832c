// dflash-web: a language model on the user's GPU through WebGPU, with DFlash
// speculative decoding. The engine runs in a dedicated Web Worker; this module is the
// main-thread API with the shape of OpenAI's client: engine.chat.completions.create().

import { CATALOG } from './catalog.js';
import { CACHE, META, MSG, CODE, CODES } from './protocol.js';

export { CATALOG, CODES };

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
  if (typeof src === 'string' || src instanceof URL) {
    try {
      return new URL(String(src), globalThis.location?.href).href;
    } catch {
      throw new DFlashError(CODE.BadRequest, `not a URL: ${JSON.stringify(String(src))}`);
    }
  }
  return src; // File / Blob: structured-cloned to the worker
}

/** The catalogue's record of `id`, or undefined. */
export function catalogEntry(id) {
  return CATALOG.find((m) => m.id === id);
}

/** Hugging Face's `{ repo, file, revision }` (revision default 'main') as its resolve URL. */
export function huggingFaceUrl({ repo, file = '', revision = 'main' }) {
  if (typeof repo !== 'string' || !/^[\w.-]+\/[\w.-]+$/.test(repo)) {
    throw new DFlashError(CODE.BadRequest, `repo must be "owner/name", not ${JSON.stringify(repo)}`);
  }
  if (typeof file !== 'string' || file.split('/').some((p) => p === '..')) {
    throw new DFlashError(CODE.BadRequest, `file must be a path inside the repo, not ${JSON.stringify(file)}`);
  }
  if (typeof revision !== 'string' || !/^[\w./-]+$/.test(revision)) {
    throw new DFlashError(CODE.BadRequest, `revision must be a branch, tag or commit, not ${JSON.stringify(revision)}`);
  }
  const path = file.split('/').map(encodeURIComponent).join('/');
  return `https://huggingface.co/${repo}/resolve/${encodeURIComponent(revision)}/${path}`;
}

/** Every part's URL when `url` names a part of a model split by llama.cpp's gguf-split
 *  ("NAME-00002-of-00003.gguf"), in order; else [url]. */
export function splitParts(url) {
  const m = /^(.*)-(\d{5})-of-(\d{5})\.gguf(\?.*)?$/.exec(url);
  if (!m || Number(m[2]) < 1 || Number(m[2]) > Number(m[3])) return [url];
  const count = Number(m[3]);
  return Array.from({ length: count }, (_, i) => `${m[1]}-${String(i + 1).padStart(5, '0')}-of-${m[3]}.gguf${m[4] ?? ''}`);
}

/** One file: a URL, a File/Blob, `{ url, sha256 }`, `{ file, sha256 }` (a Blob) or
 *  `{ repo, file, revision, sha256 }` (Hugging Face). Returns { src, sha256, size }. */
function fileSource(f, what) {
  if (typeof f === 'string' || f instanceof URL || (typeof Blob !== 'undefined' && f instanceof Blob)) return { src: absolute(f) };
  if (!f || typeof f !== 'object') throw new DFlashError(CODE.BadRequest, `${what} must be a URL, a File or { url | repo, file }, not ${JSON.stringify(f)}`);
  if (f.sha256 !== undefined && !(typeof f.sha256 === 'string' && /^[0-9a-fA-F]{64}$/.test(f.sha256))) {
    throw new DFlashError(CODE.BadRequest, `${what}.sha256 must be 64 hex digits (a sha256), not ${JSON.stringify(f.sha256)}`);
  }
  const src = f.repo !== undefined ? huggingFaceUrl(f) : absolute(f.url ?? f.file);
  if (src === undefined) throw new DFlashError(CODE.BadRequest, `${what} needs url, file or repo`);
  return { src, sha256: f.sha256, size: f.size };
}

/**
 * The model's files: { parts: [{ src, sha256, size }], name, entry }. `model` is a
 * catalogue id, a URL (every part of a split GGUF when it names one), a File,
 * `{ url | file | repo, sha256 }`, or `{ parts: [...] }` of those.
 */
function modelSource(model) {
  const entry = typeof model === 'string' ? catalogEntry(model) : undefined;
  if (entry || (typeof model === 'string' && !/[/:]/.test(model) && !/\.gguf$/i.test(model))) {
    if (!entry) {
      throw new DFlashError(CODE.BadRequest, `no model ${JSON.stringify(model)} in the catalogue (ids: ${CATALOG.map((m) => m.id).join(', ')})`);
    }
    return { parts: entry.files.map((f) => fileSource(f, `model ${entry.id}`)), name: entry.id, entry };
  }
  let parts;
  if (model && typeof model === 'object' && Array.isArray(model.parts)) {
    if (model.parts.length === 0) throw new DFlashError(CODE.BadRequest, 'model.parts is empty');
    parts = model.parts.map((p, i) => fileSource(p, `model.parts[${i}]`));
  } else {
    const one = fileSource(model, 'model');
    parts = typeof one.src === 'string' && !one.sha256
      ? splitParts(one.src).map((src) => ({ src }))
      : [one];
  }
  const first = parts[0].src;
  const base = typeof first === 'string' ? first.split('?')[0].split('/').pop() : null;
  let name = first.name ?? 'model';
  if (base !== null) {
    try { name = decodeURIComponent(base); } catch { name = base; } // a stray '%'
  }
  return { parts, name, entry: null };
}

/** A drafter folder URL (".../config.json" and ".../model.safetensors" inside it, as on
 *  the Hugging Face hub: ".../resolve/main/"), { url, sha256: { config, weights } } (the
 *  folder with pinned hashes), { repo, revision, sha256 } (a Hugging Face repo), or
 *  { config, weights }, each a URL, a File or { url, sha256 }. Returns { config, weights,
 *  sha256: { config, weights } }. */
/** A drafter's `draftVocab.ids`: how many ids its draft vocabulary lists, or null. */
function draftVocabIds(ids) {
  if (ids === undefined || ids === null) return null;
  if (!(Number.isInteger(ids) && ids >= 1 && ids < 2 ** 32)) {
    throw new DFlashError(CODE.BadRequest, `drafter.draftVocab.ids must be a positive integer (how many ids draft_vocab.json lists), not ${JSON.stringify(ids)}`);
  }
  return ids;
}

function drafterSource(d) {
  if (!d) return null;
  const pin = (h, what) => {
    if (h === undefined || (typeof h === 'string' && /^[0-9a-fA-F]{64}$/.test(h))) return h;
    throw new DFlashError(CODE.BadRequest, `${what} must be 64 hex digits (a sha256), not ${JSON.stringify(h)}`);
  };
  if (d.sha256 !== undefined && (typeof d.sha256 !== 'object' || d.sha256 === null)) {
    throw new DFlashError(CODE.BadRequest, 'drafter.sha256 must be { config?, weights?, draftVocab? }');
  }
  for (const k of ['config', 'weights', 'draftVocab']) pin(d.sha256?.[k], `drafter.sha256.${k}`);
  for (const k of ['config', 'weights', 'draftVocab']) pin(d[k]?.sha256, `drafter.${k}.sha256`);
  // A folder's draft_vocab.json is read where its hash is pinned (a folder need not have one).
  const folder = (url, sha256, size) => {
    const base = absolute(url).replace(/\/?$/, '/');
    const draftVocab = sha256?.draftVocab ? base + 'draft_vocab.json' : undefined;
    return { config: base + 'config.json', weights: base + 'model.safetensors', draftVocab, sha256: { ...sha256 }, size: { ...size } };
  };
  if (typeof d === 'string' || d instanceof URL) return folder(d, {});
  if (d.url !== undefined) return folder(d.url, d.sha256, d.size);
  if (d.repo !== undefined) return folder(huggingFaceUrl({ repo: d.repo, revision: d.revision }), d.sha256, d.size);
  const [config, weights] = [fileSource(d.config, 'drafter.config'), fileSource(d.weights, 'drafter.weights')];
  const vocab = d.draftVocab === undefined ? null : fileSource(d.draftVocab, 'drafter.draftVocab');
  return {
    config: config.src, weights: weights.src, draftVocab: vocab?.src,
    sha256: { config: config.sha256, weights: weights.sha256, draftVocab: vocab?.sha256 },
    size: { config: config.size, weights: weights.size, draftVocab: vocab?.size },
    // How many ids the draft vocabulary lists (its head's rows are in the memory plan).
    draftVocabIds: draftVocabIds(d.draftVocab?.ids),
  };
}

/**
 * Calls into the worker, answered by id. A worker whose wasm trapped (a panic) answers
 * one 'fatal' message: its request fails with code 'Panic', and `onFatal` replaces the
 * worker (`replace`), after which the calls still unanswered are sent again.
 */
class Rpc {
  constructor(worker, onFatal) {
    this.next = 1;
    this.pending = new Map();
    this.onFatal = onFatal;
    // While a replacement worker loads: calls wait (sent once it is ready).
    this.held = null;
    this.attach(worker);
  }
  attach(worker) {
    this.worker = worker;
    worker.onmessage = (e) => {
      const m = e.data;
      if (m.type === MSG.fatal) return this.fatal(m);
      const p = this.pending.get(m.id);
      if (!p) return;
      if (m.type === MSG.progress) p.onProgress?.(m.progress);
      else if (m.type === MSG.piece) p.onPiece?.(m.chunk);
      else {
        this.pending.delete(m.id);
        if (m.type === MSG.error) p.reject(new DFlashError(m.error.code, m.error.message));
        else p.resolve(m.result);
      }
    };
    worker.onerror = (e) => this.failAll(new DFlashError(CODE.WorkerError, e.message ?? 'the worker failed'));
  }
  failAll(err) {
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
    this.held = null;
  }
  /** Takes the panics of the worker's pool threads, posted on the channel `name`
   *  (the worker itself is blocked waiting for the thread that trapped). */
  listenForPoolPanics(name) {
    this.panics = new BroadcastChannel(name);
    this.panics.onmessage = (e) => {
      // Once per worker: the oldest unanswered call is the one it was running.
      if (this.held) return;
      const [id] = this.pending.keys();
      this.fatal({ id, error: { code: CODE.Panic, message: String(e.data) } });
    };
  }
  /** Stops the worker for good. */
  end() {
    this.panics?.close();
    this.worker.terminate();
  }
  /** The worker trapped: its current call fails with the panic; the others wait. */
  fatal(m) {
    const p = this.pending.get(m.id);
    this.pending.delete(m.id);
    p?.reject(new DFlashError(m.error.code, m.error.message));
    this.held ??= [];
    this.onFatal(m.error);
  }
  /** Moves to `worker` (its model loaded by `load`), then resends what is unanswered. */
  async replace(worker, load) {
    this.worker.terminate();
    this.attach(worker);
    this.held ??= [];
    try {
      const result = await this.send({ ...load, id: this.next++ }, {}, true);
      for (const msg of this.held) worker.postMessage(msg);
      for (const [id, p] of this.pending) worker.postMessage({ ...p.msg, id });
      this.held = null;
      return result;
    } catch (e) {
      // The new worker did not load: it goes too (its memory and device with it).
      worker.terminate();
      this.failAll(e);
      throw e;
    }
  }
  send(msg, handlers, now = false) {
    return new Promise((resolve, reject) => {
      const { id, ...rest } = msg;
      this.pending.set(id, { resolve, reject, msg: rest, ...handlers });
      if (now || !this.held) this.worker.postMessage(msg);
    });
  }
  call(msg, handlers = {}) {
    const id = this.next++;
    const p = this.send({ ...msg, id }, handlers);
    p.id = id;
    return p;
  }
  /** A message with no answer (the worker handles it at once, outside the queue). */
  post(msg) {
    // An abort of a call waiting for the new worker reaches it before the call.
    if (this.held) { if (msg.target !== undefined) this.held.push(msg); return; }
    this.worker.postMessage(msg);
  }
}

const aborted = () => new DFlashError(CODE.Aborted, 'the request was aborted');

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
    const { signal } = options ?? {};
    const early = !e.rpc ? new DFlashError(CODE.Unloaded, 'the engine was unloaded')
      : signal?.aborted ? aborted()
      : e.ifBusy === 'reject' && e.pending > 0 ? new DFlashError(CODE.Busy, `the engine is answering ${e.pending === 1 ? 'another request' : `${e.pending} requests`} (ifBusy: 'reject')`)
      : null;
    // Refused before it starts: a stream throws when iterated, as it would later.
    if (early) return request?.stream ? { async *[Symbol.asyncIterator]() { throw early; } } : Promise.reject(early);
    // The answer's name; the engine (Rust) shapes every object of the answer itself.
    const envelope = {
      id: `chatcmpl-dflash-${Date.now().toString(36)}-${++completionCounter}`,
      created: Math.floor(Date.now() / 1000),
      model: e.modelName,
    };
    const { stream, ...req } = request;
    // Tells the worker to stop this request (running or still queued).
    const abortIn = (call) => {
      if (!signal) return () => {};
      const stop = () => e.rpc?.post({ type: MSG.interrupt, target: call.id });
      signal.addEventListener('abort', stop, { once: true });
      return () => signal.removeEventListener('abort', stop);
    };
    const message = { type: MSG.chat, request: req, envelope, stream: !!stream };
    if (!stream) {
      const call = e.track(e.rpc.call(message));
      const done = abortIn(call);
      return new Promise((resolve, reject) => {
        signal?.addEventListener('abort', () => reject(aborted()), { once: true });
        call.then(resolve, reject).finally(done);
      });
    }
    const chunks = [];
    let wake = null;
    let finished = false;
    let failure = null;
    const push = (c) => { chunks.push(c); wake?.(); };
    const call = e.track(e.rpc.call(message, {
      onPiece: (chunk) => { if (!failure) push(chunk); },
    }));
    const done = abortIn(call);
    signal?.addEventListener('abort', () => { failure = aborted(); finished = true; chunks.length = 0; wake?.(); }, { once: true });
    call.then(
      () => { finished = true; wake?.(); },
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
  constructor({ info, modelName, ifBusy, load, spawn }) {
    this.info = info;
    this.modelName = modelName;
    this.ifBusy = ifBusy;
    /** Chat requests not yet answered: the running one and those queued behind it. */
    this.pending = 0;
    this.load = load;
    this.spawn = spawn;
    /** Workers replaced after a trap. */
    this.restarts = 0;
    this.reloading = null;
    this.chat = { completions: new Completions(this) };
  }
  track(call) {
    this.pending++;
    const done = () => { this.pending--; };
    call.then(done, done);
    return call;
  }
  /**
   * The worker's wasm trapped (the request it ran failed with code 'Panic'): a new
   * worker loads the same model and drafter (from Cache Storage) and takes the requests
   * that were waiting. Without a way to start a worker (a `worker` instance was given)
   * they fail with the panic.
   */
  restart(error) {
    if (this.reloading || !this.rpc) return;
    const rpc = this.rpc;
    let worker = null;
    try {
      worker = this.spawn?.();
    } catch {
      worker = null; // a worker that cannot start: as if none could be
    }
    if (!worker) {
      rpc.end();
      rpc.failAll(new DFlashError(error.code, `${error.message} (the worker cannot be restarted: pass worker as a function)`));
      this.rpc = null;
      return;
    }
    this.restarts++;
    this.reloading = rpc.replace(worker, this.load).then(
      (info) => { this.info = info; },
      () => { this.rpc = null; },
    ).finally(() => { this.reloading = null; });
  }
  /** TEST ONLY (a package built with DFLASH_TEST_HOOKS=1; elsewhere 'BadRequest'): a
   *  panic inside the engine (the call fails with code 'Panic' and `message`; the worker
   *  is replaced). */
  __testTrap(message) {
    return this.rpc.call({ type: MSG.testTrap, message });
  }
  /** TEST ONLY (DFLASH_TEST_HOOKS=1 builds): a panic on a thread of the CPU engine's
   *  pool while the worker waits for it (fails with code 'Panic'; the worker is replaced). */
  __testPoolPanic(message) {
    return this.rpc.call({ type: MSG.testPoolPanic, message });
  }
  /** TEST ONLY (DFLASH_TEST_HOOKS=1 builds): destroys the GPU device
   *  (GPUDevice.destroy()); requests then fail with code 'DeviceLost'. */
  __testLoseDevice() {
    return this.rpc.call({ type: MSG.testLoseDevice });
  }
  /** Ends the running request before its next token (within one step of DFlash): it
   *  resolves with the text so far and finish_reason 'abort'; the engine stays usable. */
  interrupt() {
    this.rpc?.post({ type: MSG.interrupt });
  }
  /** Forgets the conversation held in the KV cache, after the requests already made:
   *  the next request prefills its whole prompt (otherwise it keeps the rows of its
   *  longest common prefix with the last one; the tokens are the same either way). */
  resetChat() {
    if (!this.rpc) return Promise.reject(new DFlashError(CODE.Unloaded, 'the engine is unloaded'));
    return this.rpc.call({ type: MSG.resetChat });
  }
  /** Frees the GPU memory and stops the worker. */
  async unload() {
    if (!this.rpc) return;
    const rpc = this.rpc;
    this.rpc = null;
    try { await rpc.call({ type: MSG.unload }); } finally { rpc.end(); }
  }
}

/** The largest context (tokens): dflash_core::limits::MAX_CONTEXT_TOKENS. */
const MAX_CONTEXT = 1 << 24;

/** The most threads the CPU engine takes (each is a Web Worker sharing the wasm memory). */
const MAX_THREADS = 64;

/** The worker running worker.js: the page's (`worker`, an instance or a function) or
 *  a new one; `spawn` starts a replacement (null for an instance). */
function checkWorker(worker) {
  if (worker !== undefined && typeof worker !== 'function' && typeof worker?.postMessage !== 'function') {
    throw new DFlashError(CODE.BadRequest, 'worker must be a Worker or a function that returns one');
  }
}

function startWorker(worker) {
  checkWorker(worker);
  // A function can start the replacement of a worker that trapped; an instance cannot.
  const spawn = typeof worker === 'function' ? worker
    : worker ? null : () => new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
  return { w: typeof worker === 'object' ? worker : spawn(), spawn };
}

function checkContext(context) {
  if (context !== undefined && !(Number.isInteger(context) && context >= 1 && context <= MAX_CONTEXT)) {
    throw new DFlashError(CODE.BadRequest, `context must be an integer from 1 to ${MAX_CONTEXT}, not ${JSON.stringify(context)}`);
  }
}

function checkBudget(memoryBudget) {
  if (memoryBudget !== undefined && !(Number.isSafeInteger(memoryBudget) && memoryBudget > 0)) {
    throw new DFlashError(CODE.BadRequest, `memoryBudget must be a positive integer (bytes), not ${JSON.stringify(memoryBudget)}`);
  }
}

/** What the worker checks before it downloads anything: the catalogue model's shape
 *  against the adapter (or the CPU engine's memory), and the bytes of every file. */
function loadPlan(src, drafterSrc, memoryBudget) {
  const drafterSizes = drafterSrc ? [drafterSrc.size?.config, drafterSrc.size?.weights] : [];
  if (drafterSrc?.draftVocab) drafterSizes.push(drafterSrc.size?.draftVocab);
  const sizes = [...src.parts.map((p) => p.size), ...drafterSizes];
  const download = sizes.every((x) => Number.isFinite(x)) ? sizes.reduce((a, b) => a + b, 0) : null;
  const draftVocab = drafterSrc?.draftVocabIds ?? null;
  return { shape: src.entry?.shape ?? null, dflash: !!drafterSrc, budget: memoryBudget, download, draftVocab };
}

/**
 * Loads a model and optionally a DFlash drafter into a worker. `model` is a catalogue id
 * (`CATALOG`; its drafter comes with it unless `drafter: null`), a GGUF URL (every part
 * of a split GGUF), a File, `{ url | repo, file, revision, sha256 }` or `{ parts }`.
 */
export async function createEngine(options) {
  const { model, onProgress, context, worker, engine = 'auto', threads, ifBusy = 'queue', memoryBudget } = options ?? {};
  if (!['auto', 'gpu', 'cpu'].includes(engine)) throw new DFlashError(CODE.BadRequest, `engine must be 'auto', 'gpu' or 'cpu', not ${JSON.stringify(engine)}`);
  if (threads !== undefined && !(Number.isInteger(threads) && threads >= 1 && threads <= MAX_THREADS)) {
    throw new DFlashError(CODE.BadRequest, `threads must be an integer from 1 to ${MAX_THREADS}, not ${JSON.stringify(threads)}`);
  }
  if (!['queue', 'reject'].includes(ifBusy)) throw new DFlashError(CODE.BadRequest, `ifBusy must be 'queue' or 'reject', not ${JSON.stringify(ifBusy)}`);
  checkContext(context);
  checkBudget(memoryBudget);
  checkWorker(worker);
  if (engine === 'gpu' && !hasWebGPU()) throw new DFlashError(CODE.NoWebGPU, 'This browser does not support WebGPU (navigator.gpu is missing).');
  if (!model) throw new DFlashError(CODE.BadRequest, 'createEngine needs { model }');
  const src = modelSource(model);
  const drafterSrc = drafterSource(options.drafter === undefined ? src.entry?.drafter : options.drafter);
  const plan = loadPlan(src, drafterSrc, memoryBudget);
  const { w, spawn } = startWorker(worker);
  let eng = null;
  const rpc = new Rpc(w, (error) => eng?.restart(error));
  const panicChannel = `dflash-panic-${crypto.randomUUID()}`;
  rpc.listenForPoolPanics(panicChannel);
  const load = { type: MSG.load, model: { parts: src.parts }, drafter: drafterSrc, context, engine, threads, plan, panicChannel };
  try {
    const info = await rpc.call(load, { onProgress });
    eng = new Engine({ info, modelName: src.name, ifBusy, load, spawn });
    eng.rpc = rpc;
    return eng;
  } catch (e) {
    rpc.end();
    throw e;
  }
}

/**
 * What a catalogue model needs on this browser, without downloading it: `{ engine,
 * download, weights, kv_cache, activations, total }` (bytes; the GPU figures from the
 * engine's own memory plan at `context` tokens, with the drafter unless `dflash:
 * false`). Rejects with `LimitsExceeded` naming the limit where it cannot run here, and
 * `OutOfMemory` past `memoryBudget`.
 */
export async function planModel(id, { context = 2048, dflash = true, engine = 'auto', memoryBudget, worker } = {}) {
  checkContext(context);
  checkBudget(memoryBudget);
  if (worker !== undefined && typeof worker !== 'function') {
    // An engine's worker answers its own calls: a plan takes a worker of its own.
    throw new DFlashError(CODE.BadRequest, 'planModel takes worker as a function that returns a new Worker');
  }
  const entry = catalogEntry(id);
  if (!entry) throw new DFlashError(CODE.BadRequest, `no model ${JSON.stringify(id)} in the catalogue`);
  const src = modelSource(id);
  const drafterSrc = dflash ? drafterSource(entry.drafter) : null;
  const { w } = startWorker(worker);
  const rpc = new Rpc(w, () => {});
  try {
    return await rpc.call({ type: MSG.plan, context, engine, plan: loadPlan(src, drafterSrc, memoryBudget) });
  } finally {
    rpc.worker.terminate();
  }
}

/**
 * The DFlash speed of the wasm CPU engine on a named shape's synthetic pair (random
 * weights in the formats a Q4_K_M GGUF loads to; no download), in a worker of its own on
 * `threads` (where the page is cross-origin isolated): `options` are `{ shape, layers?,
 * acceptProfile, blocks, prompts?, promptTokens?, maxNewTokens?, seed?, memoryBudget? }`
 * (see `SyntheticBenchOptions` in index.d.ts). Resolves to the report (plain tok/s; per
 * block tok/s, speedup, tau and `lossless`); rejects with `OutOfMemory` before anything
 * is allocated where the weights exceed `memoryBudget` (at most 3.5 GiB, a wasm32
 * memory's room), `BadRequest` for a bad option.
 */
export async function benchSynthetic(options, { threads, worker } = {}) {
  if (worker !== undefined && typeof worker !== 'function') {
    throw new DFlashError(CODE.BadRequest, 'benchSynthetic takes worker as a function that returns a new Worker');
  }
  const { w } = startWorker(worker);
  const rpc = new Rpc(w, () => {});
  try {
    return await rpc.call({ type: MSG.benchSynthetic, options, threads });
  } finally {
    rpc.worker.terminate();
  }
}

/** The files of a catalogue model (id) or the URL(s) of a model: [url]. */
function filesOf(idOrUrl) {
  const entry = catalogEntry(idOrUrl);
  if (!entry) return splitParts(new URL(String(idOrUrl), globalThis.location?.href).href);
  const d = drafterSource(entry.drafter);
  const drafter = d ? [d.config, d.weights, ...(d.draftVocab ? [d.draftVocab] : [])] : [];
  return [...modelSource(entry.id).parts.map((p) => p.src), ...drafter];
}

/** Whether every file of a catalogue model (its id: the model's parts and its drafter)
 *  or of a model URL is in the weight cache. */
export async function hasCached(idOrUrl) {
  if (!globalThis.caches) return false;
  const have = new Set((await cachedFiles()).map((f) => f.url));
  return filesOf(idOrUrl).every((u) => have.has(u));
}

/** The files in the weight cache: [{ url, size, sha256, model }], `model` the id of the
 *  catalogue model the file belongs to (null for others). */
export async function cachedFiles() {
  if (!globalThis.caches) return [];
  const [cache, metas] = [await caches.open(CACHE), await caches.open(META)];
  const owner = new Map(CATALOG.flatMap((m) => filesOf(m.id).map((u) => [u, m.id])));
  const out = [];
  for (const req of await metas.keys()) {
    if (!(await cache.match(req))) continue;
    const m = await (await metas.match(req)).json();
    out.push({ url: m.url, size: m.size, sha256: m.sha256, model: owner.get(m.url) ?? null });
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
