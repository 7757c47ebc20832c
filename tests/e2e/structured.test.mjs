// Structured output, logprobs and tool calls through the npm package in headless
// Chromium, on the wasm CPU engine: SmolLM2 with its DFlash drafter answers a strict
// JSON schema with the native CPU engine's constrained greedy text (the same math on
// every host: dflash_core::math), DFlash on and off and streamed alike; a regex keeps
// to its pattern; logprobs are equal with DFlash and
// without; bad grammars are BadRequest naming them. Qwen2.5-Coder-0.5B (its own chat
// template writes Hermes `<tool_call>`s) answers `tool_choice: "required"` with the
// native engine's call, whole and streamed (the deltas accumulated as OpenAI's clients
// do), and a second turn with the tool's result answers in text.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { serve } from '../../www/serve.mjs';
import { ROOT, CACHE, launch, watch, MODEL, MODEL_FILE } from './common.mjs';

const QWEN_FILE = 'Qwen2.5-Coder-0.5B-Instruct.gguf';
const SCHEMA = {
  type: 'object',
  properties: { name: { type: 'string' }, age: { type: 'integer' }, indoor: { type: 'boolean' } },
  required: ['name', 'age', 'indoor'],
  additionalProperties: false,
};
const ASK = 'Describe a cat as JSON with its name, age and whether it is indoor.';
const TOOLS = [{ type: 'function', function: {
  name: 'get_weather', description: 'Get the current weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } }, required: ['city'], additionalProperties: false },
} }];
const WEATHER = 'What is the weather like in Paris today?';

let srv, browser;
before(async () => { srv = await serve({ port: 0, isolated: false }); browser = await launch(); });
after(async () => { await browser?.close(); srv?.server.close(); });

/** The native CPU engine's greedy answer with extra `dflash generate` flags. */
function nativeCpu(model, chat, n, flags) {
  const out = execFileSync(join(ROOT, 'target', 'release', 'dflash'), [
    'generate', '--model', model, '--chat', chat, '--max-new-tokens', String(n), '--json', '--device', 'cpu', ...flags,
  ], { encoding: 'utf8' });
  return JSON.parse(out);
}

async function page(tag) {
  const p = await (await browser.newContext()).newPage();
  watch(p, tag);
  await p.goto(`${srv.url}/www/index.html?model=none`);
  await p.evaluate(async () => { window.m = await import('/pkg/index.js'); });
  return p;
}

test('JSON schema, regex and logprobs on the wasm CPU engine, DFlash on and off', { timeout: 600_000 }, async () => {
  const file = join(tmpdir(), 'dflash-e2e-cat.json');
  writeFileSync(file, JSON.stringify(SCHEMA));
  const native = nativeCpu(MODEL, ASK, 60, ['--json-schema', file, '--logprobs', '2']);
  const p = await page('structured');
  const r = await p.evaluate(async ({ model, ASK, SCHEMA }) => {
    const engine = await m.createEngine({ model, engine: 'cpu', drafter: '/drafters/smollm2-135m-instruct-dflash-b16/' });
    const messages = [{ role: 'user', content: ASK }];
    const format = { type: 'json_schema', json_schema: { name: 'cat', schema: SCHEMA, strict: true } };
    const ask = (extra) => engine.chat.completions.create({ messages, max_tokens: 60, temperature: 0, response_format: format, ...extra });
    const on = await ask({ dflash: true, block: 8 });
    const off = await ask({ dflash: false });
    let streamed = '';
    for await (const c of await ask({ stream: true })) streamed += c.choices[0]?.delta?.content ?? '';
    const phone = await engine.chat.completions.create({
      messages: [{ role: 'user', content: 'Give a US phone number.' }], max_tokens: 20, temperature: 0,
      grammar: { type: 'regex', pattern: '\\([0-9]{3}\\) [0-9]{3}-[0-9]{4}' },
    });
    const lp = async (dflash) => (await engine.chat.completions.create({ messages, max_tokens: 10, temperature: 0, logprobs: true, top_logprobs: 2, dflash })).choices[0].logprobs.content;
    const code = (p) => p.then(() => null, (e) => ({ code: e.code, message: e.message }));
    const badSchema = await code(ask({ response_format: { type: 'json_schema', json_schema: { schema: { type: 'integer', minimum: 3, maximum: 1 } } } }));
    const badRegex = await code(ask({ response_format: null, grammar: { type: 'regex', pattern: '(ab' } }));
    const noTools = await code(ask({ response_format: null, tools: [{ type: 'function', function: { name: 'f' } }] }));
    const out = {
      on: on.choices[0], off: off.choices[0].message.content, streamed, phone: phone.choices[0].message.content,
      lpOn: await lp(true), lpOff: await lp(false), badSchema, badRegex, noTools, dflash: on.usage.dflash,
    };
    await engine.unload();
    return out;
  }, { model: `/models/${MODEL_FILE}`, ASK, SCHEMA });
  console.log(JSON.stringify({ json: r.off, phone: r.phone, dflash: r.dflash, lp: r.lpOn[0] }));
  assert.equal(r.on.finish_reason, 'stop');
  const want = native.text;
  assert.equal(r.on.message.content, want, 'the native CPU engine\'s constrained greedy answer');
  assert.equal(r.off, want, 'DFlash on and off give the same answer');
  assert.equal(r.streamed, want);
  const cat = JSON.parse(want);
  assert.deepEqual(Object.keys(cat), ['name', 'age', 'indoor']);
  assert.ok(typeof cat.name === 'string' && Number.isInteger(cat.age) && typeof cat.indoor === 'boolean');
  assert.match(r.phone, /^\([0-9]{3}\) [0-9]{3}-[0-9]{4}$/);
  assert.equal(r.lpOn.length, 10);
  assert.deepEqual(r.lpOn, r.lpOff, 'logprobs with DFlash equal those without');
  for (const e of [r.badSchema, r.badRegex]) {
    assert.equal(e.code, 'BadRequest');
    assert.match(e.message, /grammar/);
  }
  assert.equal(r.noTools.code, 'BadRequest');
  assert.match(r.noTools.message, /renders no tool calls/);
});

test('tool calls on Qwen2.5-Coder in the browser: whole, streamed and a second turn', { timeout: 900_000 }, async (t) => {
  const model = join(CACHE, 'models', QWEN_FILE);
  if (!existsSync(model)) return t.skip(`${QWEN_FILE} is not in the cache (scripts/fetch-models.sh)`);
  const tools = join(tmpdir(), 'dflash-e2e-tools.json');
  writeFileSync(tools, JSON.stringify(TOOLS));
  const want = nativeCpu(model, WEATHER, 60, ['--tools', tools, '--tool-choice', 'required']).tool_calls;
  const p = await page('tools');
  const r = await p.evaluate(async ({ model, WEATHER, TOOLS }) => {
    const engine = await m.createEngine({ model, engine: 'cpu' });
    const messages = [{ role: 'user', content: WEATHER }];
    const req = { messages, tools: TOOLS, tool_choice: 'required', max_tokens: 60, temperature: 0 };
    const whole = await engine.chat.completions.create(req);
    // The stream's deltas accumulated by index, as OpenAI's clients do.
    const calls = [];
    let finish = null;
    for await (const c of await engine.chat.completions.create({ ...req, stream: true })) {
      for (const d of c.choices[0]?.delta?.tool_calls ?? []) {
        const call = (calls[d.index] ??= { id: '', type: 'function', function: { name: '', arguments: '' } });
        call.id = d.id ?? call.id;
        call.function.name += d.function?.name ?? '';
        call.function.arguments += d.function?.arguments ?? '';
      }
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    const msg = whole.choices[0].message;
    const turn2 = await engine.chat.completions.create({
      messages: [...messages, msg, { role: 'tool', tool_call_id: msg.tool_calls[0].id, content: '{"temperature": 21}' }],
      tools: TOOLS, tool_choice: 'none', max_tokens: 24, temperature: 0,
    });
    await engine.unload();
    return { whole: whole.choices[0], calls, finish, turn2: turn2.choices[0] };
  }, { model: `/models/${QWEN_FILE}`, WEATHER, TOOLS });
  console.log(JSON.stringify({ calls: r.whole.message.tool_calls, turn2: r.turn2.message.content }));
  const strip = (cs) => cs.map((c) => [c.function.name, c.function.arguments]);
  assert.equal(r.whole.finish_reason, 'tool_calls');
  assert.deepEqual(strip(r.whole.message.tool_calls), strip(want), 'the native engine\'s call');
  assert.deepEqual(strip(r.calls), strip(want), 'the streamed deltas add up to the same call');
  assert.equal(r.finish, 'tool_calls');
  assert.ok(r.turn2.message.content.length > 0 && !r.turn2.message.tool_calls);
});
