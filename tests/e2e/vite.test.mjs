// The packed npm package in an app built by a bundler, as web developers use it: `npm
// pack` in pkg/, the tarball installed into an empty Vite app whose module imports
// 'dflash-web' by name, `vite build`, and the built app (dist/ only, the package's worker,
// wasm and shipped drafter emitted by Vite) served and run in headless Chromium. It
// loads SmolLM2-135M-Instruct with the catalogue's drafter (the files Vite emitted),
// answers greedily with DFlash (the native CPU engine's text) and once more through
// a worker the app supplies itself.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, readdirSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { build } from 'vite';
import { serve } from '../../www/serve.mjs';
import { ROOT, launch, nativeGreedy, watch, PROMPT, MODEL_FILE } from './common.mjs';

const N = 8;

const MAIN = `import { createEngine, catalogEntry } from 'dflash-web';
// Vite's own way to bundle a dependency's worker.
import DFlashWorker from 'dflash-web/worker.js?worker';
const run = async () => {
  const request = { messages: [{ role: 'user', content: ${JSON.stringify(PROMPT)} }], max_tokens: ${N}, temperature: 0, block: 4 };
  // The catalogue's SmolLM2 drafter, from the files the bundler emitted.
  const drafter = catalogEntry('smollm2-135m-instruct-q4_1').drafter;
  const engine = await createEngine({ model: '/models/${MODEL_FILE}', drafter });
  const r = await engine.chat.completions.create(request);
  await engine.unload();
  // A worker the app makes itself (the package's worker, bundled as the app's own).
  const own = await createEngine({
    model: '/models/${MODEL_FILE}',
    worker: () => new DFlashWorker(),
  });
  const plain = await own.chat.completions.create({ ...request, dflash: false });
  await own.unload();
  return { text: r.choices[0].message.content, usage: r.usage, info: engine.info, drafterUrl: drafter.weights.url, plain: plain.choices[0].message.content };
};
run().then((r) => { window.__result = r; }, (e) => { window.__result = { error: e.code + ': ' + e.message }; });
`;

test('a Vite app bundling the packed package loads, drafts and answers', { timeout: 900_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'dflash-vite-'));
  const tgz = execFileSync('npm', ['pack', '--silent', '--pack-destination', dir], { cwd: join(ROOT, 'pkg'), encoding: 'utf8' }).trim().split('\n').pop();
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'vite-consumer', private: true, type: 'module' }));
  execFileSync('npm', ['install', '--no-audit', '--no-fund', '--offline', join(dir, tgz)], { cwd: dir, stdio: 'inherit' });
  writeFileSync(join(dir, 'index.html'), '<!doctype html><meta charset="utf-8"><link rel="icon" href="data:,"><script type="module" src="/main.js"></script>\n');
  writeFileSync(join(dir, 'main.js'), MAIN);
  await build({
    root: dir, logLevel: 'warn', configFile: false,
    // The package's workers are ES modules (they import the wasm glue).
    worker: { format: 'es' },
    build: { outDir: join(dir, 'dist'), emptyOutDir: true, target: 'es2022' },
  });
  const assets = readdirSync(join(dir, 'dist', 'assets'));
  assert.ok(assets.some((f) => f.endsWith('.wasm')), `the engine's wasm is emitted: ${assets}`);
  assert.ok(assets.some((f) => f.startsWith('model') && f.endsWith('.safetensors')), `the drafter is emitted: ${assets}`);
  assert.ok(!existsSync(join(dir, 'dist', 'node_modules')));

  const expected = nativeGreedy(PROMPT, N, 'cpu');
  const srv = await serve({ port: 0, root: join(dir, 'dist') });
  const browser = await launch();
  try {
    const page = await browser.newPage();
    watch(page, 'vite');
    await page.goto(`${srv.url}/index.html`);
    await page.waitForFunction(() => window.__result, null, { timeout: 600_000 });
    const r = await page.evaluate(() => window.__result);
    assert.equal(r.error, undefined, r.error);
    assert.equal(r.info.engine, 'cpu');
    assert.equal(r.info.drafter.block_size, 16);
    assert.ok(r.drafterUrl.includes('/assets/'), r.drafterUrl);
    assert.equal(r.usage.dflash.enabled, true);
    assert.equal(r.text, expected.text, 'DFlash in the bundled app gives the native greedy text');
    assert.equal(r.plain, expected.text, 'the app-supplied worker gives the same text');
    console.log(JSON.stringify({ vite_assets: assets.length, mean_tau: r.usage.dflash.mean_tau, decode_tok_s: r.usage.decode_tok_s }));
  } finally {
    await browser.close();
    srv.server.close();
  }
});
