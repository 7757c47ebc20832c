// What the main thread (index.js) and the worker (worker.js) share, defined once: the
// names of the weight caches, the messages between them, and the error codes of
// DFlashError (index.d.ts's DFlashErrorCode lists the same; tests/node/rpc.test.mjs
// checks it, and that every code the wasm's error mapping gives is one of them).

/** Cache Storage: the weight files by URL, and beside them (Cache Storage ignores URL
 *  fragments) each file's size and sha256 under the same URL. */
export const CACHE = 'dflash-web-v1';
export const META = 'dflash-web-meta-v1';

/** Messages to the worker (each with an `id`, answered by one `result` or `error`,
 *  `interrupt` excepted) and from it (`progress` and `piece` along the way; `fatal` once
 *  its wasm trapped). A `chat` carries the request, its `envelope` ({ id, created,
 *  model }) and whether it streams; its `piece`s carry the `chunk`s and its `result` the
 *  whole `chat.completion`, all shaped by the engine (Rust), forwarded as they are. */
export const MSG = Object.freeze({
  load: 'load',
  plan: 'plan',
  /** The CPU engine's speed on a named shape's synthetic pair (`benchSynthetic`). */
  benchSynthetic: 'benchSynthetic',
  chat: 'chat',
  resetChat: 'resetChat',
  unload: 'unload',
  /** No answer: stops the running request (or the queued one `target` names). */
  interrupt: 'interrupt',
  testTrap: '__trap',
  testPoolPanic: '__poolPanic',
  testLoseDevice: '__loseDevice',
  progress: 'progress',
  piece: 'piece',
  result: 'result',
  error: 'error',
  fatal: 'fatal',
});

/** Every DFlashError code. */
export const CODES = Object.freeze([
  'NoWebGPU', 'OutOfMemory', 'LimitsExceeded', 'BadModelFile', 'DrafterMismatch', 'DeviceLost',
  'ContextOverflow', 'BadRequest', 'Unsupported', 'NetworkError', 'IntegrityError', 'CacheCorrupt',
  'Busy', 'Aborted', 'Panic', 'Unloaded', 'GpuError', 'WorkerError', 'Error',
]);

/** The codes by name (`CODE.BadRequest`), so that a misspelt one is undefined at once. */
export const CODE = Object.freeze(Object.fromEntries(CODES.map((c) => [c, c])));
