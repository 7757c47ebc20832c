// The demo page in headless Chromium (WebGPU on SwiftShader): loads SmolLM2-135M-Instruct
// and its DFlash drafter from the dev server, generates 16 tokens greedily with DFlash
// off and on, and asserts both texts equal the native engine's greedy text; saves a
// screenshot and the speeds (tests/e2e/out/). Error paths: no WebGPU (the page's
// message and the API's typed error) and a file that is not a model.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync, readFileSync, mkdirSync, copyFileSync } from 'node:fs';
import { join } from 'node:path';
import { serve } from '../../www/serve.mjs';
import { launch, nativeGreedy, watch, OUT, PROMPT, DRAFTER } from './common.mjs';

const N = 16;
let srv;
before(async () => { srv = await serve({ port: 0 }); });
after(() => srv.server.close());

test('the demo generates the native greedy text with DFlash off and on', { timeout: 900_000 }, async () => {
  const expected = nativeGreedy(PROMPT, N);
  assert.equal(expected.tokens, N, 'the prompt should not end before N tokens');
  const browser = await launch();
  try {
    const page = await browser.newPage({ viewport: { width: 900, height: 900 } });
    watch(page, 'demo');
    const t0 = Date.now();
    await page.goto(`${srv.url}/www/?max_tokens=${N}&block=4&temperature=0`);
    await page.waitForFunction(() => ['ready', 'error', 'nogpu'].includes(document.body.dataset.state), null, { timeout: 600_000 });
    const state = await page.evaluate(() => document.body.dataset.state);
    assert.equal(state, 'ready', await page.textContent('#status'));
    const info = await page.evaluate(() => window.__info);
    const results = { adapter: info.adapter, load_s: info.load_s, page_load_s: (Date.now() - t0) / 1000, runs: [] };
    for (const dflash of [false, true]) {
      await page.setChecked('#dflash', dflash);
      await page.fill('#prompt', PROMPT);
      await page.click('#send');
      await page.waitForFunction(() => ['done', 'error'].includes(document.body.dataset.state), null, { timeout: 600_000 });
      const last = await page.evaluate(() => window.__last ?? window.__error);
      assert.ok(last.text !== undefined, `generation failed: ${JSON.stringify(last)}`);
      assert.equal(last.usage.completion_tokens, expected.tokens);
      assert.equal(last.text, expected.text, `DFlash ${dflash ? 'on' : 'off'}: browser text differs from the native greedy text`);
      assert.equal(last.usage.dflash.enabled, dflash);
      results.runs.push({ dflash, decode_tok_s: last.usage.decode_tok_s, prefill_tok_s: last.usage.prefill_tok_s, mean_tau: last.usage.dflash.mean_tau ?? null, accepted_tokens: last.usage.dflash.accepted_tokens ?? null });
      await page.evaluate(() => { window.__last = null; });
    }
    await page.screenshot({ path: join(OUT, 'demo.png'), fullPage: true });
    results.text = expected.text;
    writeFileSync(join(OUT, 'demo.json'), JSON.stringify(results, null, 2));
    console.log(JSON.stringify(results));
  } finally {
    await browser.close();
  }
});

test('without WebGPU the page says so and the API throws NoWebGPU', { timeout: 120_000 }, async () => {
  const browser = await launch({ webgpu: false });
  try {
    const page = await browser.newPage();
    await page.addInitScript(() => { Object.defineProperty(Navigator.prototype, 'gpu', { get: () => undefined, configurable: true }); });
    await page.goto(`${srv.url}/www/`);
    await page.waitForFunction(() => document.body.dataset.state === 'nogpu', null, { timeout: 60_000 });
    assert.ok(await page.isVisible('#nogpu'));
    assert.match(await page.textContent('#nogpu'), /WebGPU is not available/);
    const err = await page.evaluate(async () => {
      const m = await import('/pkg/index.js');
      try { await m.createEngine({ model: '/models/none.gguf' }); return null; } catch (e) { return { name: e.name, code: e.code, isClass: e instanceof m.DFlashError }; }
    });
    assert.deepEqual(err, { name: 'DFlashError', code: 'NoWebGPU', isClass: true });
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
