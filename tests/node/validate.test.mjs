// The package's checks without a browser: the wasm's validateRequest (the checks the
// worker runs before a chat request) loaded in node with initSync, the panic hook that
// names a trap's cause, and createEngine's own option checks (pkg/index.js touches
// Worker and navigator only after them). Needs pkg/dist (scripts/build-pkg.sh).
//   node --test tests/node/
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const GLUE = join(ROOT, 'pkg', 'dist', 'dflash_web.js');
const WASM = join(ROOT, 'pkg', 'dist', 'dflash_web_bg.wasm');

const wasm = await import(GLUE);
wasm.initSync({ module: readFileSync(WASM) });

/** The error validateRequest throws, as { code, message }, or null. */
function check(request) {
  try {
    wasm.validateRequest(request);
    return null;
  } catch (e) {
    return { name: e.name, code: e.code, message: e.message };
  }
}

const ok = [{ role: 'user', content: 'hi' }];

test('valid requests pass', () => {
  for (const r of [
    { messages: ok },
    { messages: ok, temperature: 0, max_tokens: 8, top_p: 0.9, top_k: 40, min_p: 0.05, seed: 7 },
    { messages: ok, stop: ['\n'], stream: true, dflash: false, block: 'auto', model: 'x' },
    { messages: [{ role: 'system', content: 's' }, ...ok, { role: 'assistant', content: 'a' }], block: 4 },
    { messages: ok, rejection_sampling: true, sampled_drafts: true, temperature: 0.8 },
    { messages: ok, response_format: { type: 'json_object' }, temperature: null, top_p: null },
    { messages: ok, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object' }, strict: true } } },
    { messages: ok, grammar: { type: 'regex', pattern: '[0-9]+' }, no_such_field: 1, temprature: 0.5 },
    { messages: ok, logprobs: true, top_logprobs: 5, tools: [{ type: 'function', function: { name: 'f' } }], tool_choice: 'required' },
  ]) {
    assert.equal(check(r), null, JSON.stringify(r));
  }
});

// Each bad request is a BadRequest whose message names the field: a NaN arrives as
// null (serde_wasm_bindgen) and must never become the field's default.
test('bad requests are BadRequest naming the field', () => {
  const cases = [
    [{ messages: ok, temperature: NaN }, 'temperature'],
    [{ messages: ok, temperature: Infinity }, 'temperature'],
    [{ messages: ok, top_p: -Infinity }, 'top_p'],
    [{ messages: ok, min_p: NaN }, 'min_p'],
    [{ messages: ok, max_tokens: NaN }, 'max_tokens'],
    [{ messages: ok, max_completion_tokens: Infinity }, 'max_completion_tokens'],
    [{ messages: ok, top_k: NaN }, 'top_k'],
    [{ messages: ok, seed: NaN }, 'seed'],
    [{ messages: ok, block: NaN }, 'block'],
    [{ messages: ok, temperature: -1 }, 'temperature'],
    [{ messages: ok, top_p: 0 }, 'top_p'],
    [{ messages: ok, top_p: 1.5 }, 'top_p'],
    [{ messages: ok, min_p: -0.1 }, 'min_p'],
    [{ messages: ok, response_format: { type: 'yaml' } }, 'response_format.type'],
    [{ messages: ok, grammar: { type: 'lark' } }, 'grammar.grammar'],
    [{ messages: ok, max_tokens: -1 }, 'max_tokens'],
    [{ messages: ok, max_tokens: 2.5 }, 'max_tokens'],
    [{ messages: ok, top_k: -3 }, 'top_k'],
    [{ messages: ok, seed: -1 }, 'seed'],
    [{ messages: ok, block: 0 }, 'block'],
    [{ messages: ok, block: -2 }, 'block'],
    [{ messages: ok, block: 'big' }, 'block'],
    [{ messages: ok, temperature: '0.5' }, 'temperature'],
    [{ messages: ok, max_tokens: '16' }, 'max_tokens'],
    [{ messages: ok, dflash: 'yes' }, 'dflash'],
    [{ messages: ok, stream: 1 }, 'stream'],
    [{ messages: [] }, 'messages'],
    [{}, 'messages'],
    [{ messages: 'hi' }, 'messages'],
    [{ messages: [{ role: 'robot', content: 'x' }] }, 'role'],
    [{ messages: [{ role: 'user' }] }, 'messages[0].content'],
    [{ messages: [{ role: 'user', content: 5 }] }, 'messages[0].content'],
    [{ messages: [{ content: 'x' }] }, 'messages[0].role'],
    [{ messages: ok, tools: [{ type: 'function', function: { name: 'bad name' } }] }, 'tools[0].function.name'],
    [{ messages: ok, logprobs: true, top_logprobs: 21 }, 'top_logprobs'],
  ];
  for (const [r, field] of cases) {
    const e = check(r);
    assert.ok(e, `accepted: ${JSON.stringify(r)}`);
    assert.equal(e.code, 'BadRequest', `${field}: ${e.message}`);
    assert.equal(e.name, 'DFlashError');
    assert.ok(e.message.includes(field), `${JSON.stringify(r)}: the message should name ${field}: ${e.message}`);
  }
  for (const r of [null, 5, 'hi', [ok]]) assert.equal(check(r)?.code, 'BadRequest', JSON.stringify(r));
});

// A trap in a running wasm future surfaces as an uncaught RuntimeError ('unreachable')
// that says nothing of the cause; the panic hook kept the message for takePanic. (In a
// child process: the trap is an uncaught exception there, as in the worker.)
test('a panic is named by takePanic after the trap', () => {
  const script = `
    import { readFileSync } from 'node:fs';
    const m = await import(${JSON.stringify(GLUE)});
    m.initSync({ module: readFileSync(${JSON.stringify(WASM)}) });
    process.on('uncaughtException', (e) => {
      console.log(JSON.stringify({ trap: e instanceof WebAssembly.RuntimeError, panic: m.takePanic(), again: m.takePanic() ?? null }));
      process.exit(0);
    });
    m.__testTrap('deliberate test panic 42');
  `;
  const out = execFileSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  const r = JSON.parse(out.trim().split('\n').pop());
  assert.equal(r.trap, true);
  assert.match(r.panic, /^deliberate test panic 42 \(at .*src\/wasm\/mod\.rs:\d+\)$/);
  assert.equal(r.again, null, 'taken once');
});

test("createEngine's own option checks are BadRequest (NoWebGPU for engine 'gpu' without WebGPU)", async () => {
  const { createEngine, DFlashError, hasWebGPU } = await import(join(ROOT, 'pkg', 'index.js'));
  assert.equal(hasWebGPU(), false);
  const code = async (opts) => {
    try {
      await createEngine(opts);
      return null;
    } catch (e) {
      assert.ok(e instanceof DFlashError, String(e));
      return e.code;
    }
  };
  const model = '/models/x.gguf';
  for (const opts of [
    undefined, {}, { model: '' },
    { model, engine: 'tpu' }, { model, engine: null },
    { model, threads: 0 }, { model, threads: 65 }, { model, threads: 1.5 }, { model, threads: '2' }, { model, threads: NaN },
    { model, ifBusy: 'wait' }, { model, ifBusy: null },
    { model, context: 0 }, { model, context: NaN }, { model, context: '2048' },
    { model, worker: 5 },
    // Drafter pins that are not sha256s.
    { model, drafter: { url: '/d/', sha256: 'ab' } }, { model, drafter: { url: '/d/', sha256: { weights: 'xyz' } } },
    { model, drafter: { url: '/d/', sha256: { config: 12 } } },
    { model, drafter: { config: '/c.json', weights: { url: '/w', sha256: '0'.repeat(63) } } },
  ]) {
    assert.equal(await code(opts), 'BadRequest', JSON.stringify(opts));
  }
  assert.equal(await code({ model, engine: 'gpu' }), 'NoWebGPU');
});

test('index.d.ts declares exactly the request fields the parser takes', () => {
  const dts = readFileSync(join(ROOT, 'pkg', 'index.d.ts'), 'utf8');
  const body = dts.split('export interface ChatCompletionRequest {')[1].split('\n}')[0];
  const declared = [...body.matchAll(/^\s{2}(\w+)\??:/gm)].map((m) => m[1]).sort();
  assert.deepEqual(declared, [...wasm.requestFields()].sort());
});

test('OpenAI default fields pass; values that would change the answer name the field', () => {
  const webllm = {
    messages: [{ role: 'developer', content: 's', name: 'd' }, { role: 'user', content: [{ type: 'text', text: 'hi' }] }],
    n: 1, frequency_penalty: 0, presence_penalty: 0, logprobs: false, user: 'u', stream: true,
    stream_options: { include_usage: true }, tools: [], tool_choice: 'none', response_format: { type: 'text' },
  };
  assert.equal(check(webllm), null);
  for (const [k, v] of [['n', 2], ['logprobs', 'yes'], ['tools', [{ type: 'function' }]], ['frequency_penalty', NaN]]) {
    const e = check({ ...webllm, [k]: v });
    assert.equal(e?.code, 'BadRequest', k);
    assert.match(e.message, new RegExp(k), k);
  }
});

test("the CPU engine's SIMD128 kernels, packed and unpacked, are the scalar definition, bit for bit", (t) => {
  // A test-hooks build (scripts/test.sh builds one) compares them inside the wasm.
  if (typeof wasm.__testKernels !== 'function') return t.skip('pkg/dist built without DFLASH_TEST_HOOKS=1');
  const r = wasm.__testKernels();
  for (const kind of ['packed', 'unpacked']) {
    const { bad, all, kernels } = r[kind];
    console.log(`${kind} kernels compared with the scalar definition in wasm: ${kernels.join(', ')} (${all} values)`);
    assert.deepEqual(kernels, ['simd128'], kind);
    assert.ok(all > 0, `${kind}: values compared`);
    assert.equal(bad, 0, `${kind}: ${bad} of ${all} values differ`);
  }
});
