// The npm package as a user gets it: `npm pack` in pkg/, the tarball installed into an
// empty folder, a page that imports it from node_modules and runs a chat (plain and
// streamed) in headless Chromium on the default engine (the CPU engine, as the only
// adapter is SwiftShader); the answer equals the native CPU engine's greedy text, and
// the streamed pieces' token ids its tokens. A
// five-turn conversation keeps its KV rows between turns (usage's cached_tokens) and
// gives the texts of the same turns after resetChat(); turn 5's time to first token is
// printed both ways.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, readdirSync, readFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { serve } from '../../www/serve.mjs';
import { ROOT, launch, nativeGreedy, watch, PROMPT, MODEL, MODEL_FILE } from './common.mjs';

const N = 8;
// The user messages of the multi-turn conversation, and the tokens of each reply.
const TURNS = ['Hi! Who are you?', 'What is two plus two?', 'And three plus three?', 'Name a colour.', 'Thanks, goodbye.'];
const TURN_TOKENS = 6;

test('the packed npm package installs into an empty folder and chats', { timeout: 900_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'dflash-consumer-'));
  const tgz = execFileSync('npm', ['pack', '--silent', '--pack-destination', dir], { cwd: join(ROOT, 'pkg'), encoding: 'utf8' }).trim().split('\n').pop();
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'consumer', private: true, type: 'module' }));
  execFileSync('npm', ['install', '--no-audit', '--no-fund', '--offline', join(dir, tgz)], { cwd: dir, stdio: 'inherit' });
  const files = readdirSync(join(dir, 'node_modules', 'dflash-web')).sort();
  assert.deepEqual(files.filter((f) => !f.startsWith('.')), ['README.md', 'catalog.js', 'dist', 'drafters', 'index.d.ts', 'index.js', 'package.json', 'protocol.js', 'worker.js']);
  writeFileSync(join(dir, 'index.html'), `<!doctype html><meta charset="utf-8"><link rel="icon" href="data:,">
<script type="module">
import { createEngine, cachedFiles, clearCache } from './node_modules/dflash-web/index.js';
try {
  const model = '/models/${MODEL_FILE}';
  const engine = await createEngine({ model });
  const req = { messages: [{ role: 'user', content: ${JSON.stringify(PROMPT)} }], max_tokens: ${N}, temperature: 0 };
  const whole = await engine.chat.completions.create(req);
  let streamed = '', last = null, n = 0;
  const ids = [];
  for await (const c of await engine.chat.completions.create({ ...req, stream: true })) {
    streamed += c.choices[0].delta.content ?? '';
    ids.push(...(c.dflash?.token_ids ?? []));
    last = c;
    n++;
  }
  // Seeded sampling (the GPU sampler in the browser) is reproducible.
  const sampled = [];
  for (let i = 0; i < 2; i++) {
    const r = await engine.chat.completions.create({ ...req, temperature: 0.8, top_p: 0.95, seed: 5 });
    sampled.push(r.choices[0].message.content);
  }
  // Multi-turn KV reuse: five turns, each keeping the rows its prompt shares with the
  // last, against the same turns after resetChat() (each prefilled whole).
  const conversation = async (reset) => {
    const messages = [], out = [];
    await engine.resetChat();
    for (const content of ${JSON.stringify(TURNS)}) {
      messages.push({ role: 'user', content });
      if (reset) await engine.resetChat();
      const r = await engine.chat.completions.create({ messages, max_tokens: ${TURN_TOKENS}, temperature: 0 });
      const u = r.usage;
      out.push({ text: r.choices[0].message.content, prompt: u.prompt_tokens, cached: u.prompt_tokens_details.cached_tokens, ttft: u.time_to_first_token_s });
      messages.push({ role: 'assistant', content: r.choices[0].message.content });
    }
    return out;
  };
  const reused = await conversation(false);
  const prefilled = await conversation(true);
  await engine.unload();
  let unloadedReset = null;
  try { await engine.resetChat(); } catch (e) { unloadedReset = e.code; }
  // The second load comes from Cache Storage, hash-checked; a wrong pinned hash is refused.
  const cached = await cachedFiles();
  const again = await createEngine({ model });
  const info2 = again.info;
  await again.unload();
  let wrongHash = null;
  try { await createEngine({ model: { url: model, sha256: '00'.repeat(32) } }); } catch (e) { wrongHash = e.code; }
  await clearCache();
  const afterClear = await cachedFiles();
  window.__result = { whole, streamed, ids, last, n, first: engine.info, cached, info2, wrongHash, afterClear, sampled, turns: { reused, prefilled }, unloadedReset };
} catch (e) { window.__result = { error: e.code + ': ' + e.message }; }
</script>`);
  // Chromium's only adapter here is SwiftShader, a software fallback: the default engine
  // ('auto') is the CPU engine, whose text equals the native CPU engine's.
  const expected = nativeGreedy(PROMPT, N, 'cpu');
  const srv = await serve({ port: 0, root: dir });
  const browser = await launch();
  try {
    const page = await browser.newPage();
    watch(page, 'consumer');
    await page.goto(`${srv.url}/index.html`);
    await page.waitForFunction(() => window.__result, null, { timeout: 600_000 });
    const r = await page.evaluate(() => window.__result);
    assert.equal(r.error, undefined, r.error);
    assert.equal(r.first.engine, 'cpu', 'auto chooses the CPU engine over a software adapter');
    assert.equal(r.whole.object, 'chat.completion');
    assert.equal(r.whole.choices[0].message.role, 'assistant');
    assert.equal(r.whole.choices[0].message.content, expected.text);
    assert.equal(r.whole.choices[0].finish_reason, expected.tokens < N ? 'stop' : 'length');
    assert.equal(r.whole.usage.completion_tokens, expected.tokens);
    assert.ok(r.whole.usage.prompt_tokens > 10);
    assert.equal(r.whole.usage.dflash.enabled, false);
    assert.equal(r.streamed, expected.text);
    assert.deepEqual(r.ids, expected.ids, "the pieces' token ids are the native engine's tokens");
    assert.equal(r.last.object, 'chat.completion.chunk');
    assert.equal(r.last.usage.completion_tokens, expected.tokens);
    assert.ok(r.n >= 3);
    assert.ok(r.sampled[0].length > 0);
    assert.equal(r.sampled[0], r.sampled[1], 'the same seed gives the same sampled text');
    // Cache: the file's sha256, the second load from the cache, clearing.
    const sha = createHash('sha256').update(readFileSync(MODEL)).digest('hex');
    assert.equal(r.first.sha256, sha);
    assert.equal(r.first.from_cache, false);
    assert.deepEqual(r.cached.map((c) => [c.url.endsWith(MODEL_FILE), c.sha256]), [[true, sha]]);
    assert.equal(r.info2.from_cache, true);
    assert.equal(r.info2.sha256, sha);
    assert.equal(r.wrongHash, 'IntegrityError');
    assert.deepEqual(r.afterClear, []);
    // KV reuse: the same texts; from turn 2 on, at least the last turn's prompt kept.
    const { reused, prefilled: fresh } = r.turns;
    assert.deepEqual(reused.map((t) => t.text), fresh.map((t) => t.text));
    assert.deepEqual(fresh.map((t) => t.cached), fresh.map(() => 0));
    for (let i = 1; i < reused.length; i++) {
      assert.ok(reused[i].cached >= reused[i - 1].prompt, `turn ${i + 1} kept ${reused[i].cached} of ${reused[i].prompt}`);
      assert.ok(reused[i].cached < reused[i].prompt);
    }
    assert.equal(r.unloadedReset, 'Unloaded');
    const last = reused.length - 1;
    console.log(JSON.stringify({
      load_s: r.first.load_s, cached_load_s: r.info2.load_s, engine: r.first.engine,
      turn5: { prompt_tokens: reused[last].prompt, cached_tokens: reused[last].cached, ttft_reuse_s: reused[last].ttft, ttft_whole_s: fresh[last].ttft },
    }));
  } finally {
    await browser.close();
    srv.server.close();
  }
});
