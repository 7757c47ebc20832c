// The browser's CPU engine benched on a synthetic pair through the package's
// `benchSynthetic` (tests/bench/synthetic.mjs): in a worker on two threads (the page is
// cross-origin isolated) with the SIMD128 kernels, every DFlash output equal to plain
// decoding's; a shape past the memory budget is refused with OutOfMemory before anything
// is allocated, and a bad option with BadRequest.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { benchInBrowser } from '../bench/synthetic.mjs';

test('a synthetic pair decodes losslessly on the wasm CPU engine on two threads', async () => {
  const r = await benchInBrowser({
    shape: 'test-tiny', acceptProfile: [0.9, 0.9, 0.9], blocks: ['4', 'auto'], promptTokens: 16, maxNewTokens: 24, prompts: 2,
  }, { threads: 2 });
  console.log(JSON.stringify(r));
  assert.equal(r.error, undefined);
  assert.equal(r.isolated, true);
  assert.deepEqual([r.report.cpu.kernel, r.report.cpu.threads, r.report.wasm_threads], ['simd128', 2, 2]);
  assert.equal(r.report.plain_tokens, 48);
  assert.deepEqual(r.report.runs.map((x) => [x.block, x.lossless]), [['4', true], ['auto', true]]);
  // Drafts right 90% of the time at block 4: well over one token per step.
  assert.ok(r.report.runs[0].mean_tau > 2, JSON.stringify(r.report.runs[0]));
});

test('a shape past the memory budget is OutOfMemory before allocation; a bad option is BadRequest', async () => {
  const t0 = Date.now();
  const big = await benchInBrowser({ shape: 'qwen3-8b', acceptProfile: [0.8], blocks: ['8'], memoryBudget: 1e9 }, { threads: 1 });
  assert.equal(big.error?.code, 'OutOfMemory', JSON.stringify(big));
  assert.ok(Date.now() - t0 < 30_000, 'refused at once, nothing made');
  const past = await benchInBrowser({ shape: 'qwen3-8b', acceptProfile: [0.8], blocks: ['8'] }, { threads: 1 });
  assert.equal(past.error?.code, 'OutOfMemory', 'past what a wasm32 memory holds: ' + JSON.stringify(past));
  for (const [options, words] of [
    [{ shape: 'test-tiny', acceptProfile: [1.5], blocks: ['4'] }, 'outside [0, 1]'],
    [{ shape: 'test-tiny', acceptProfile: Array(20).fill(0.5), blocks: ['4'] }, 'draft slots'],
    [{ shape: 'no-such', acceptProfile: [0.5], blocks: ['4'] }, 'no model shape'],
    [{ shape: 'test-tiny', acceptProfile: [0.5], blocks: ['0'] }, 'neither rows'],
    [{ shape: 'test-tiny', acceptProfile: [0.5], blocks: ['4'], layers: 99 }, 'layers'],
    [{ shape: 'test-tiny', acceptProfile: [0.5], blocks: ['4'], colour: 'red' }, 'unknown field'],
  ]) {
    const r = await benchInBrowser(options, { threads: 1 });
    assert.equal(r.error?.code, 'BadRequest', JSON.stringify(r));
    assert.ok(r.error.message.includes(words), `${r.error.message} (want ${words})`);
  }
});
