// A model split in parts by gguf-split, in the browser: SmolLM2-135M-Instruct cut into
// three GGUF files (common.mjs's splitGguf, as gguf-split writes them) and named by its
// first part loads every part, reports each part's sha256 and progress, answers with the
// native engine's greedy text on the whole file, and comes from the cache the second
// time; parts in the wrong order are BadModelFile and a missing part NetworkError.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync, rmSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { serve } from '../../www/serve.mjs';
import { launch, nativeGreedy, watch, splitGguf, PROMPT, MODEL } from './common.mjs';

const N = 8;

test('a split GGUF loads part after part in the browser', { timeout: 600_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'dflash-split-'));
  const parts = splitGguf(readFileSync(MODEL), 3);
  const names = [1, 2, 3].map((i) => `smollm2-0000${i}-of-00003.gguf`);
  parts.forEach((p, i) => writeFileSync(join(dir, names[i]), p));
  const shas = parts.map((p) => createHash('sha256').update(p).digest('hex'));
  const expected = nativeGreedy(PROMPT, N, 'cpu');
  const srv = await serve({ port: 0, models: dir });
  const browser = await launch();
  try {
    const page = await browser.newPage();
    watch(page, 'split');
    await page.goto(`${srv.url}/www/?model=none`);
    const run = (code) => page.evaluate(code, { names, prompt: PROMPT, n: N });
    const r = await run(async ({ names, prompt, n }) => {
      const m = await import('/pkg/index.js');
      const seen = new Set();
      const load = () => m.createEngine({ model: `/models/${names[0]}`, engine: 'cpu', onProgress: (p) => p.part && seen.add(p.part) });
      const engine = await load();
      const r = await engine.chat.completions.create({ messages: [{ role: 'user', content: prompt }], max_tokens: n, temperature: 0 });
      await engine.unload();
      const again = await load();
      await again.unload();
      const cached = (await m.cachedFiles()).length;
      const hasCached = await m.hasCached(`/models/${names[1]}`);
      const code = (opts) => m.createEngine({ engine: 'cpu', ...opts }).then(() => 'ok', (e) => e.code);
      const wrongOrder = await code({ model: { parts: [0, 2, 1].map((i) => `/models/${names[i]}`) } });
      // One part of three given (a pinned URL is one file): refused once its header is in.
      const short = await code({ model: { parts: [`/models/${names[0]}`] } });
      return { text: r.choices[0].message.content, info: engine.info, again: again.info, parts: [...seen].sort(), cached, hasCached, wrongOrder, short };
    });
    assert.equal(r.text, expected.text, 'the split model answers as the whole file');
    assert.equal(r.info.parts, 3);
    assert.deepEqual(r.info.part_sha256, shas);
    assert.equal(r.info.sha256, shas[0]);
    assert.deepEqual(r.parts, [1, 2, 3]);
    assert.equal(r.again.from_cache, true);
    assert.equal(r.cached, 3);
    assert.equal(r.hasCached, true);
    assert.equal(r.wrongOrder, 'BadModelFile');
    assert.equal(r.short, 'BadRequest');
    // A missing part: its fetch fails, and nothing of the attempt is cached.
    rmSync(join(dir, names[2]));
    const missing = await page.evaluate(async ({ names }) => {
      const m = await import('/pkg/index.js');
      await m.clearCache();
      const code = await m.createEngine({ model: `/models/${names[0]}`, engine: 'cpu' }).then(() => 'ok', (e) => e.code);
      return { code, cached: (await m.cachedFiles()).map((f) => f.url.split('/').pop()) };
    }, { names });
    assert.equal(missing.code, 'NetworkError');
    assert.deepEqual(missing.cached.sort(), names.slice(0, 2), 'the parts that loaded stay cached; none of the missing one');
  } finally {
    await browser.close();
    srv.server.close();
  }
});
