// The demo page in headless Chromium: loads SmolLM2-135M-Instruct and its DFlash drafter
// from the dev server on the GPU engine (WebGPU on SwiftShader) and on the CPU engine
// (wasm SIMD; on one thread, and on two where the page is cross-origin isolated),
// generates 16 tokens greedily with DFlash off and on, and asserts every
// text equals the native engine's greedy text on the same kind of engine; saves
// screenshots and the speeds (tests/e2e/out/). Error paths: no WebGPU (the CPU engine
// runs; engine 'gpu' is a typed error) and a file that is not a model.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync, readFileSync, mkdirSync, copyFileSync } from 'node:fs';
import { join } from 'node:path';
import { serve } from '../../www/serve.mjs';
import { launch, nativeGreedy, watch, OUT, PROMPT, DRAFTER } from './common.mjs';

const N = 16;
// The dev server without cross-origin isolation (one thread), and with it.
let srv, isolated;
before(async () => { srv = await serve({ port: 0, isolated: false }); isolated = await serve({ port: 0 }); });
after(() => { srv.server.close(); isolated.server.close(); });

/** Loads the demo on `engine` (with `threads`, from the isolated server) and generates
 *  N tokens with DFlash off and on. */
async function demoRun(browser, engine, expected, threads) {
  const page = await browser.newPage({ viewport: { width: 900, height: 900 } });
  const tag = threads ? `${engine}-${threads}threads` : engine;
  watch(page, `demo ${tag}`);
  const t0 = Date.now();
  const base = threads ? `${isolated.url}/www/?threads=${threads}&` : `${srv.url}/www/?`;
  await page.goto(`${base}max_tokens=${N}&block=4&temperature=0&engine=${engine}`);
  await page.waitForFunction(() => ['ready', 'error', 'nogpu'].includes(document.body.dataset.state), null, { timeout: 600_000 });
  const state = await page.evaluate(() => document.body.dataset.state);
  assert.equal(state, 'ready', await page.textContent('#status'));
  const info = await page.evaluate(() => window.__info);
  assert.equal(info.engine, engine);
  if (engine === 'cpu') assert.equal(info.cpu.threads, threads ?? 1, 'the CPU engine runs on the threads asked for');
  const results = { engine, adapter: info.adapter, cpu: info.cpu ?? null, load_s: info.load_s, page_load_s: (Date.now() - t0) / 1000, runs: [] };
  for (const dflash of [false, true]) {
    await page.setChecked('#dflash', dflash);
    // Each run a conversation of its own (the demo keeps the last one otherwise).
    await page.click('#newchat');
    await page.fill('#prompt', PROMPT);
    await page.click('#send');
    await page.waitForFunction(() => ['done', 'error'].includes(document.body.dataset.state), null, { timeout: 600_000 });
    const last = await page.evaluate(() => window.__last ?? window.__error);
    assert.ok(last.text !== undefined, `generation failed: ${JSON.stringify(last)}`);
    assert.equal(last.usage.completion_tokens, expected.tokens);
    assert.equal(last.text, expected.text, `${engine}, DFlash ${dflash ? 'on' : 'off'}: browser text differs from the native greedy text`);
    assert.equal(last.usage.dflash.enabled, dflash);
    results.runs.push({ dflash, decode_tok_s: last.usage.decode_tok_s, prefill_tok_s: last.usage.prefill_tok_s, mean_tau: last.usage.dflash.mean_tau ?? null, accepted_tokens: last.usage.dflash.accepted_tokens ?? null });
    await page.evaluate(() => { window.__last = null; });
  }
  await page.screenshot({ path: join(OUT, `demo-${tag}.png`), fullPage: true });
  results.text = expected.text;
  await page.close();
  return results;
}

// The GPU engine on SwiftShader against the native GPU engine; the CPU engine (wasm
// SIMD128 kernels) against the native CPU engine (AVX2/VNNI kernels): the same text
// token for token, as the kernels are bit-identical by construction and a row's sums
// never depend on how the rows are split across threads.
test('the demo generates the native greedy text on both engines with DFlash off and on', { timeout: 900_000 }, async () => {
  const browser = await launch();
  try {
    const all = {};
    for (const [engine, device, threads] of [['gpu', 'gpu'], ['cpu', 'cpu'], ['cpu', 'cpu', 2]]) {
      const expected = nativeGreedy(PROMPT, N, device);
      assert.equal(expected.tokens, N, 'the prompt should not end before N tokens');
      all[threads ? `${engine}-${threads}threads` : engine] = await demoRun(browser, engine, expected, threads);
    }
    writeFileSync(join(OUT, 'demo.json'), JSON.stringify(all, null, 2));
    console.log(JSON.stringify(all));
  } finally {
    await browser.close();
  }
});

// The picker lists the catalogue and says what a catalogue model needs on this adapter
// (from the engine's memory plan, nothing downloaded); a model named by URL loads with
// one progress bar for all its files; the conversation is kept across turns (the second
// turn keeps the first's KV rows); Stop ends a long answer early; 'compare with plain'
// runs the turn again without DFlash and shows the speedup, with the same text.
test("the demo's picker, progress, conversation, Stop and comparison", { timeout: 600_000 }, async () => {
  const browser = await launch();
  try {
    const page = await browser.newPage({ viewport: { width: 900, height: 1000 } });
    watch(page, 'demo picker');
    await page.goto(`${srv.url}/www/?model=none&engine=cpu&max_tokens=8&block=4&temperature=0`);
    const { ids, options } = await page.evaluate(async () => ({
      ids: (await import('/pkg/index.js')).CATALOG.map((m) => m.id),
      options: [...document.querySelectorAll('#model option')].map((o) => o.value),
    }));
    assert.deepEqual(options, ['local', ...ids, 'custom']);
    await page.selectOption('#model', 'qwen2.5-32b-instruct-q4_k_m');
    await page.waitForFunction(() => /to download|cannot run/.test(document.getElementById('plan').textContent), null, { timeout: 60_000 });
    const plan = await page.textContent('#plan');
    // The CPU engine (asked for here) cannot hold 19.9 GB: refused before any download.
    assert.match(plan, /cannot run here \(LimitsExceeded\)/, plan);
    await page.screenshot({ path: join(OUT, 'demo-picker.png'), fullPage: true });
    // On the GPU (SwiftShader here) the engine's own memory plan of the shape: a plan
    // (weights at least the files' bytes, as repacked) or the limit it exceeds; a budget
    // too small for it is OutOfMemory. Nothing is downloaded.
    const gpuPlans = await page.evaluate(async () => {
      const m = await import('/pkg/index.js');
      const plan = (id, opts) => m.planModel(id, { engine: 'gpu', ...opts }).catch((e) => ({ code: e.code, message: e.message }));
      return { qwen3: await plan('qwen3-8b-q4_k_m'), budget: await plan('qwen3-4b-q4_k_m', { memoryBudget: 1e9 }) };
    });
    const q = gpuPlans.qwen3;
    assert.ok(q.code === 'LimitsExceeded' || (q.engine === 'gpu' && q.weights > 5e9 && q.total > q.weights), JSON.stringify(q));
    assert.ok(['OutOfMemory', 'LimitsExceeded'].includes(gpuPlans.budget.code), JSON.stringify(gpuPlans.budget));
    console.log(JSON.stringify({ gpu_plans: gpuPlans }));
    await page.selectOption('#model', 'custom');
    await page.fill('#model_url', '/models/SmolLM2-135M-Instruct.Q4_1.gguf');
    await page.fill('#drafter_url', '/drafters/smollm2-135m-instruct-dflash-b16/');
    const texts = [];
    await page.exposeFunction('__progressText', (t) => texts.push(t));
    await page.evaluate(() => new MutationObserver(() => window.__progressText(document.getElementById('status').textContent))
      .observe(document.getElementById('status'), { childList: true, characterData: true, subtree: true }));
    await page.click('#load');
    await page.waitForFunction(() => ['ready', 'error'].includes(document.body.dataset.state), null, { timeout: 300_000 });
    assert.equal(await page.evaluate(() => document.body.dataset.state), 'ready', await page.textContent('#status'));
    assert.ok(texts.some((t) => /model: [\d.]+ of [\d.]+ MB/.test(t) && /MB in all/.test(t)), texts.join('\n'));
    assert.ok(texts.some((t) => /drafter weights/.test(t)), texts.join('\n'));
    const turn = async () => {
      await page.click('#send');
      await page.waitForFunction(() => ['done', 'error'].includes(document.body.dataset.state), null, { timeout: 300_000 });
      return page.evaluate(() => window.__last ?? window.__error);
    };
    await page.fill('#prompt', 'Hi! Who are you?');
    const first = await turn();
    await page.fill('#prompt', 'And what can you do?');
    await page.setChecked('#compare', true);
    const second = await turn();
    assert.ok(second.usage.prompt_tokens_details.cached_tokens > first.usage.prompt_tokens, JSON.stringify(second.usage));
    const compare = await page.evaluate(() => window.__compare);
    assert.equal(compare.same, true, 'the plain run gives the same text');
    assert.match(await page.textContent('#compare_result'), /DFlash [\d.]+× plain decoding/);
    await page.screenshot({ path: join(OUT, 'demo-conversation.png'), fullPage: true });
    // Stop: a long answer ends at the next step, with the text so far.
    await page.setChecked('#compare', false);
    await page.fill('#max_tokens', '200');
    await page.fill('#prompt', 'Tell me a long story about a dragon.');
    await page.click('#send');
    await page.waitForFunction(() => document.getElementById('output').textContent.length > 0, null, { timeout: 120_000 });
    await page.click('#stop');
    await page.waitForFunction(() => ['done', 'error'].includes(document.body.dataset.state), null, { timeout: 120_000 });
    const stopped = await page.evaluate(() => window.__last ?? window.__error);
    assert.equal(stopped.finish_reason, 'abort', JSON.stringify(stopped));
    assert.ok(stopped.usage.completion_tokens < 200);
    assert.match(await page.textContent('#stats'), /stopped/);
    await page.screenshot({ path: join(OUT, 'demo-stopped.png'), fullPage: true });
  } finally {
    await browser.close();
  }
});

test('without WebGPU the page runs the CPU engine and engine gpu throws NoWebGPU', { timeout: 300_000 }, async () => {
  const browser = await launch({ webgpu: false });
  try {
    const page = await browser.newPage();
    watch(page, 'nogpu');
    await page.addInitScript(() => { Object.defineProperty(Navigator.prototype, 'gpu', { get: () => undefined, configurable: true }); });
    await page.goto(`${srv.url}/www/?dflash=0`);
    await page.waitForFunction(() => ['ready', 'error', 'nogpu'].includes(document.body.dataset.state), null, { timeout: 240_000 });
    assert.equal(await page.evaluate(() => document.body.dataset.state), 'ready', await page.textContent('#status'));
    assert.equal(await page.evaluate(() => window.__info.engine), 'cpu');
    assert.match(await page.textContent('#adapter'), /CPU engine/);
    const err = await page.evaluate(async () => {
      const m = await import('/pkg/index.js');
      const code = async (opts) => { try { await m.createEngine(opts); return null; } catch (e) { return { name: e.name, code: e.code, isClass: e instanceof m.DFlashError }; } };
      return [await code({ model: '/models/none.gguf', engine: 'gpu' }), await code({ model: '/models/none.gguf', engine: 'tpu' }),
        await code({ model: '/models/none.gguf', engine: 'cpu', threads: 0 })];
    });
    const bad = { name: 'DFlashError', code: 'BadRequest', isClass: true };
    assert.deepEqual(err, [{ name: 'DFlashError', code: 'NoWebGPU', isClass: true }, bad, bad]);
  } finally {
    await browser.close();
  }
});

test('a file that is not a model, a missing file and a mismatched drafter get typed errors', { timeout: 300_000 }, async () => {
  // The committed drafter, told it was trained for a target of 24 layers.
  const bad = join(OUT, 'mismatched-drafter');
  mkdirSync(bad, { recursive: true });
  const cfg = JSON.parse(readFileSync(join(DRAFTER, 'config.json'), 'utf8'));
  cfg.num_target_layers = 24;
  writeFileSync(join(bad, 'config.json'), JSON.stringify(cfg));
  copyFileSync(join(DRAFTER, 'model.safetensors'), join(bad, 'model.safetensors'));
  const browser = await launch();
  try {
    const page = await browser.newPage();
    watch(page, 'errors');
    await page.goto(`${srv.url}/www/index.html?model=none`);
    const codes = await page.evaluate(async () => {
      const m = await import('/pkg/index.js');
      const code = async (opts) => { try { await m.createEngine(opts); return null; } catch (e) { return e.code; } };
      return {
        notAModel: await code({ model: '/www/index.html' }),
        missing: await code({ model: '/models/does-not-exist.gguf' }),
        noDrafter: await code({ model: '/models/SmolLM2-135M-Instruct.Q4_1.gguf', drafter: '/www/' }),
        mismatch: await code({ model: '/models/SmolLM2-135M-Instruct.Q4_1.gguf', drafter: '/tests/e2e/out/mismatched-drafter/' }),
      };
    });
    assert.deepEqual(codes, { notAModel: 'BadModelFile', missing: 'NetworkError', noDrafter: 'NetworkError', mismatch: 'DrafterMismatch' });
  } finally {
    await browser.close();
  }
});

// Aborting and interrupting: an AbortSignal rejects the request with code 'Aborted' at
// once; engine.interrupt() ends the running request before its next token
// (finish_reason 'abort', fewer tokens than asked) on both engines, the CPU engine with
// DFlash too; either way the
// engine answers the next request.
test('an aborted or interrupted request ends and the engine answers the next one', { timeout: 600_000 }, async () => {
  const browser = await launch();
  try {
    const page = await browser.newPage();
    watch(page, 'abort');
    await page.goto(`${srv.url}/www/index.html?model=none`);
    const r = await page.evaluate(async () => {
      const m = await import('/pkg/index.js');
      const out = {};
      // The CPU engine with DFlash too (block 4): it yields between steps.
      const kinds = [['gpu', 'gpu'], ['cpu', 'cpu'], ['cpu-dflash', 'cpu', '/drafters/smollm2-135m-instruct-dflash-b16/']];
      for (const [kind, engineKind, drafter] of kinds) {
        const engine = await m.createEngine({ model: '/models/SmolLM2-135M-Instruct.Q4_1.gguf', engine: engineKind, drafter });
        const req = { messages: [{ role: 'user', content: 'Tell me a long story about a dragon and a knight.' }], max_tokens: 40, temperature: 0, block: 4 };
        const ac = new AbortController();
        let pieces = 0;
        let code = null;
        try {
          for await (const c of engine.chat.completions.create({ ...req, stream: true }, { signal: ac.signal })) {
            if (c.choices[0].delta.content && ++pieces === 2) ac.abort();
          }
        } catch (e) { code = e.code; }
        let interrupted = null;
        let first = true;
        for await (const c of engine.chat.completions.create({ ...req, stream: true })) {
          if (c.choices[0].delta.content && first) { first = false; engine.interrupt(); }
          if (c.usage) interrupted = { finish_reason: c.choices[0].finish_reason, completion_tokens: c.usage.completion_tokens };
        }
        const next = await engine.chat.completions.create({ ...req, max_tokens: 4 });
        const preAborted = await engine.chat.completions.create(req, { signal: AbortSignal.abort() }).then(() => null, (e) => e.code);
        out[kind] = { code, pieces, interrupted, next: next.usage.completion_tokens, preAborted };
        await engine.unload();
      }
      return out;
    });
    console.log(JSON.stringify(r));
    for (const kind of ['gpu', 'cpu', 'cpu-dflash']) {
      assert.equal(r[kind].code, 'Aborted', kind);
      assert.equal(r[kind].pieces, 2, `${kind}: no piece after the abort`);
      assert.equal(r[kind].next, 4, `${kind}: the engine answers after an abort`);
      assert.equal(r[kind].preAborted, 'Aborted', kind);
    }
    // Both engines stop within a step of the interrupt (the CPU engine yields to the
    // worker between tokens, and between DFlash steps: at most the first token and two
    // blocks of 4 there).
    for (const [kind, most] of [['gpu', 3], ['cpu', 3], ['cpu-dflash', 9]]) {
      assert.equal(r[kind].interrupted.finish_reason, 'abort', kind);
      assert.ok(r[kind].interrupted.completion_tokens <= most, `${kind}: ${JSON.stringify(r[kind].interrupted)}`);
    }
  } finally {
    await browser.close();
  }
});
