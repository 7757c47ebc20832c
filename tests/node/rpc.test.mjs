// The main thread's side of the worker protocol, in node with a fake worker (no browser,
// no wasm): createEngine's load and progress, chat completions whole and streamed
// (OpenAI's chunk shapes, include_usage), errors, an AbortSignal's interrupt, ifBusy
// 'reject', and a trapped worker replaced with the waiting call sent again; and the
// protocol's codes defined once (protocol.js against index.d.ts, the wasm's mapping and
// every CODE.x the package uses).
//   node --test tests/node/
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const { createEngine } = await import(join(ROOT, 'pkg', 'index.js'));
const { MSG, CODES } = await import(join(ROOT, 'pkg', 'protocol.js'));

const INFO = { engine: 'cpu', context: 2048, drafter: null, sha256: '0'.repeat(64) };
const USAGE = { prompt_tokens: 5, completion_tokens: 2, dflash: { enabled: false } };

/** A worker that answers each message with `answer(msg, reply)` (reply posts back). */
class FakeWorker {
  constructor(answer) {
    this.answer = answer;
    this.got = [];
    this.terminated = false;
  }
  postMessage(msg) {
    this.got.push(msg);
    const reply = (m) => setTimeout(() => this.onmessage?.({ data: { id: msg.id, ...m } }), 1);
    this.answer(msg, reply);
  }
  terminate() { this.terminated = true; }
}

/** What the wasm engine sends for a chat message (shaped in Rust by
 *  dflash_engine::response::Reply, whose shapes crates/dflash-engine/tests/engine.rs and
 *  the Chromium tests check): the stream's chunks, and the whole completion. */
const shaped = (msg) => {
  const { id, created, model } = msg.envelope;
  const env = (object, choices, extra = {}) => ({ id, object, created, model, choices, ...extra });
  const chunk = (delta, finish, extra) => env('chat.completion.chunk', [{ index: 0, delta, finish_reason: finish }], extra);
  return {
    role: chunk({ role: 'assistant', content: '' }, null),
    piece: (text, drafted) => chunk({ content: text }, null, { dflash: { drafted } }),
    last: (finish, usage) => [chunk({}, finish, { usage }),
      ...(msg.request.stream_options?.include_usage ? [env('chat.completion.chunk', [], { usage })] : [])],
    whole: (text, finish, usage) => env('chat.completion', [{ index: 0, message: { role: 'assistant', content: text }, finish_reason: finish }], { usage }),
  };
};

/** Loads answer with progress then the info; chats with two pieces and the result. */
const normal = (msg, reply) => {
  if (msg.type === MSG.load) {
    reply({ type: MSG.progress, progress: { phase: 'download', loaded: 1, total: 2 } });
    reply({ type: MSG.result, result: INFO });
  } else if (msg.type === MSG.chat) {
    const r = shaped(msg);
    if (msg.stream) {
      for (const chunk of [r.role, r.piece('He', false), r.piece('llo', true), ...r.last('length', USAGE)]) reply({ type: MSG.piece, chunk });
    }
    reply({ type: MSG.result, result: r.whole('Hello', 'length', USAGE) });
  } else if (msg.type === MSG.unload) {
    reply({ type: MSG.result, result: null });
  }
};

const MODEL = 'https://example.org/m/model.Q4_1.gguf';
const REQ = { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 };

test('load, progress and a whole completion in OpenAI\'s shape', async () => {
  const w = new FakeWorker(normal);
  const progress = [];
  const engine = await createEngine({ model: MODEL, worker: w, onProgress: (p) => progress.push(p) });
  assert.deepEqual(engine.info, INFO);
  assert.equal(progress.length, 1);
  const load = w.got[0];
  assert.equal(load.type, MSG.load);
  assert.deepEqual(load.model.parts.map((p) => p.src), [MODEL]);
  const r = await engine.chat.completions.create(REQ);
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, 'model.Q4_1.gguf');
  assert.deepEqual(r.choices, [{ index: 0, message: { role: 'assistant', content: 'Hello' }, finish_reason: 'length' }]);
  assert.deepEqual(r.usage, USAGE);
  assert.deepEqual(w.got[1].request, REQ);
  // The package names the answer; the engine shapes it with that name.
  assert.equal(w.got[1].envelope.model, 'model.Q4_1.gguf');
  assert.equal(w.got[1].stream, false);
  assert.equal(r.id, w.got[1].envelope.id);
  await engine.unload();
  assert.ok(w.terminated);
  await assert.rejects(engine.chat.completions.create(REQ), (e) => e.code === 'Unloaded');
});

test('a stream yields the role, each piece with its drafted flag, the finish and include_usage', async () => {
  const engine = await createEngine({ model: MODEL, worker: new FakeWorker(normal) });
  const chunks = [];
  for await (const c of engine.chat.completions.create({ ...REQ, stream: true, stream_options: { include_usage: true } })) chunks.push(c);
  assert.ok(chunks.every((c) => c.object === 'chat.completion.chunk' && c.id === chunks[0].id));
  assert.deepEqual(chunks.map((c) => c.choices[0]?.delta ?? null), [{ role: 'assistant', content: '' }, { content: 'He' }, { content: 'llo' }, {}, null]);
  assert.deepEqual(chunks.map((c) => c.dflash?.drafted), [undefined, false, true, undefined, undefined]);
  assert.equal(chunks[3].choices[0].finish_reason, 'length');
  assert.deepEqual(chunks[3].usage, USAGE);
  assert.deepEqual(chunks[4].choices, []);
  assert.deepEqual(chunks[4].usage, USAGE);
  // The worker never sees `stream`: the iterator is the main thread's.
  await engine.unload();
});

test("a worker's error is the request's DFlashError, whole or streamed", async () => {
  const failing = (msg, reply) => {
    if (msg.type === MSG.chat) reply({ type: MSG.error, error: { code: 'ContextOverflow', message: 'too long' } });
    else normal(msg, reply);
  };
  const engine = await createEngine({ model: MODEL, worker: new FakeWorker(failing) });
  await assert.rejects(engine.chat.completions.create(REQ), (e) => e.name === 'DFlashError' && e.code === 'ContextOverflow' && e.message === 'too long');
  await assert.rejects(async () => { for await (const _ of engine.chat.completions.create({ ...REQ, stream: true })); }, (e) => e.code === 'ContextOverflow');
  await engine.unload();
});

test('an AbortSignal interrupts its request in the worker and the stream throws Aborted', async () => {
  let chatId = null;
  let whole = null;
  const slow = (msg, reply) => {
    if (msg.type === MSG.chat) {
      chatId = msg.id;
      const r = shaped(msg);
      whole = r.whole('a', 'abort', USAGE);
      reply({ type: MSG.piece, chunk: r.role });
      reply({ type: MSG.piece, chunk: r.piece('a', false) });
    } // then nothing until interrupted
    else if (msg.type === MSG.interrupt) setTimeout(() => w.onmessage({ data: { id: chatId, type: MSG.result, result: whole } }), 1);
    else normal(msg, reply);
  };
  const w = new FakeWorker(slow);
  const engine = await createEngine({ model: MODEL, worker: w });
  const ac = new AbortController();
  const seen = [];
  await assert.rejects(async () => {
    for await (const c of engine.chat.completions.create({ ...REQ, stream: true }, { signal: ac.signal })) {
      seen.push(c);
      if (c.choices[0]?.delta.content) ac.abort();
    }
  }, (e) => e.code === 'Aborted');
  assert.deepEqual(w.got.find((m) => m.type === MSG.interrupt), { type: MSG.interrupt, target: chatId });
  assert.equal(seen.length, 2);
  // A signal aborted before the call: refused at once, nothing sent.
  const sent = w.got.length;
  await assert.rejects(engine.chat.completions.create(REQ, { signal: AbortSignal.abort() }), (e) => e.code === 'Aborted');
  assert.equal(w.got.length, sent);
  await engine.unload();
});

test("ifBusy 'reject' refuses a request while another is unanswered", async () => {
  let release = null;
  const held = (msg, reply) => {
    if (msg.type === MSG.chat) release = () => reply({ type: MSG.result, result: shaped(msg).whole('', 'stop', USAGE) });
    else normal(msg, reply);
  };
  const engine = await createEngine({ model: MODEL, worker: new FakeWorker(held), ifBusy: 'reject' });
  const first = engine.chat.completions.create(REQ);
  assert.equal(engine.pending, 1);
  await assert.rejects(engine.chat.completions.create(REQ), (e) => e.code === 'Busy');
  release();
  await first;
  assert.equal(engine.pending, 0);
  await engine.unload();
});

test('a trapped worker fails its request with Panic; a new one loads and takes the waiting call', async () => {
  const workers = [];
  const spawn = () => {
    const n = workers.length;
    const w = new FakeWorker((msg, reply) => {
      // The first worker traps on its first chat; the second answers normally.
      if (n === 0 && msg.type === MSG.chat && !workers[0].trapped) {
        workers[0].trapped = true;
        reply({ type: MSG.fatal, error: { code: 'Panic', message: 'index out of bounds' } });
      } else if (n === 0 && msg.type === MSG.chat) {
        // The queued call, sent before the trap was seen: this worker is dead.
      } else normal(msg, reply);
    });
    workers.push(w);
    return w;
  };
  const engine = await createEngine({ model: MODEL, worker: spawn });
  const [a, b] = [engine.chat.completions.create(REQ), engine.chat.completions.create(REQ)];
  await assert.rejects(a, (e) => e.code === 'Panic' && /index out of bounds/.test(e.message));
  const r = await b;
  assert.equal(r.choices[0].message.content, 'Hello');
  assert.equal(engine.restarts, 1);
  assert.ok(workers[0].terminated);
  assert.deepEqual(workers[1].got.map((m) => m.type), [MSG.load, MSG.chat]);
  await engine.unload();
});

test('the error codes are defined once: protocol.js, index.d.ts and the wasm mapping agree', () => {
  const dts = readFileSync(join(ROOT, 'pkg', 'index.d.ts'), 'utf8');
  // The union's lines, their comments dropped, up to its last member.
  const union = dts.split('export type DFlashErrorCode =')[1].split('\n\n')[0].split('\n').map((l) => l.split('//')[0]).join(' ');
  assert.deepEqual([...union.matchAll(/'(\w+)'/g)].map((m) => m[1]).sort(), [...CODES].sort());
  const rust = readFileSync(join(ROOT, 'crates', 'dflash-engine', 'src', 'errors.rs'), 'utf8');
  const mapped = new Set([...rust.matchAll(/=> "(\w+)"/g)].map((m) => m[1]));
  assert.ok(mapped.size >= 8);
  for (const c of mapped) assert.ok(CODES.includes(c), `errors.rs maps to ${c}, not a code of protocol.js`);
  for (const f of ['index.js', 'worker.js']) {
    const src = readFileSync(join(ROOT, 'pkg', f), 'utf8');
    for (const [, c] of src.matchAll(/CODE\.(\w+)/g)) assert.ok(CODES.includes(c), `${f}: CODE.${c}`);
    for (const [, t] of src.matchAll(/MSG\.(\w+)/g)) assert.ok(t in MSG, `${f}: MSG.${t}`);
    assert.ok(!/'dflash-web-(meta-)?v1'/.test(src), `${f} names a cache itself`);
  }
});
