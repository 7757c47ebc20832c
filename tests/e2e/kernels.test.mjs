// The kernels GPUs run in the browser compiled by Chromium's own WGSL compiler (Tint) on
// SwiftShader, within the browser's 16 KiB of workgroup storage: the demo and the
// consumer test run the CPU adapter's kernels there (SwiftShader is a CPU adapter), so
// this compiles the GPU tuning's variants (Tuning::gpu and intel_xe2: GEMV lanes and rows
// per thread with every fusion and the DFlash tap, the chunked sampler, chunked attention with head and row
// tiles). The sources are assembled as crates/dflash-gpu/src/pipelines.rs `source` does
// (f32 KV: SwiftShader has no shader-f16).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import http from 'node:http';
import { launch, ROOT } from './common.mjs';

const shader = (f) => readFileSync(join(ROOT, 'shaders', f), 'utf8');
const prelude = (kv) => (kv ? 'alias kv_t = f32;\n' : '') + 'const WG: u32 = 64u;\n' + shader('common.wgsl') + '\n';
const sources = {
  gemv: prelude(false) + shader('gemv.wgsl') + '\n' + shader('quant.wgsl'),
  sample: prelude(false) + shader('sample.wgsl') + '\n' + shader('random.wgsl'),
  attention_chunks: prelude(true) + shader('attention_chunks.wgsl'),
  moe: prelude(false) + shader('moe.wgsl'),
  delta_net: prelude(false) + shader('delta_net.wgsl'),
};

function variants() {
  const v = [];
  // (lanes, rows per thread, threads): GPUs and Intel's large matrices; Intel's narrow
  // rule; SwiftShader's own entry (Tuning::swiftshader: the GPU engine, engine: 'gpu', on
  // Chrome's fallback adapter).
  for (const [lanes, outs, threads] of [[16, 4, 64], [4, 1, 64], [1, 2, 16]]) {
    for (const n of [1, 16]) {
      for (const [entry, norm, bias, pair, acc] of [['main', 0, 0, 0, 1], ['main', 1, 1, 0, 0], ['main', 1, 0, 1, 0], ['main_argmax', 1, 0, 0, 0]]) {
        for (const [format, group] of [[0, 32], [1, 32], [1, 16]]) {
          const c = { FORMAT: format, GROUP: group, N_ROWS: n, LANES: lanes, OUTS: pair ? Math.max(1, outs / 2) : outs, THREADS: threads, NORM: norm, BIAS: bias, PAIR: pair, ACCUMULATE: acc };
          v.push({ shader: 'gemv', entry, c });
          if (acc) v.push({ shader: 'gemv', entry: 'main_tap', c }); // a DFlash tap in the residual's epilogue
        }
      }
    }
  }
  // A mixture's expert GEMVs (gate/up with the norm and SwiGLU; down over slot rows), its
  // router and the weighted sum.
  for (const [lanes, outs] of [[16, 4], [1, 4]]) {
    for (const [norm, pair, slots] of [[1, 1, 0], [1, 0, 0], [0, 0, 1]]) {
      const c = { FORMAT: 0, GROUP: 32, N_ROWS: 16, LANES: lanes, OUTS: pair ? outs / 2 : outs, NORM: norm, PAIR: pair, EXPERT_K: 8, X_SLOTS: slots };
      v.push({ shader: 'gemv', entry: 'main_experts', c });
    }
  }
  for (const entry of ['route', 'combine', 'combine_tap']) v.push({ shader: 'moe', entry, c: { EXPERT_K: 8 } });
  // Qwen3.5's Gated DeltaNet layers: the convolution and the recurrence.
  for (const entry of ['conv', 'recur']) v.push({ shader: 'delta_net', entry, c: {} });
  for (const entry of ['chunk_max', 'prepare', 'chunk_mass', 'draw']) v.push({ shader: 'sample', entry, c: {} });
  for (const mode of [0, 1]) for (const entry of ['histogram', 'select_byte']) v.push({ shader: 'sample', entry, c: { MODE: mode } });
  // (head tile, row tile) of SmolLM2 (3 heads per KV head), Qwen3-8B (4), and 1 and 8.
  for (const [tile, rows] of [[3, 1], [3, 5], [4, 1], [4, 4], [1, 16], [8, 2]]) {
    for (const [style, norm] of [[1, 1], [0, 0]]) {
      v.push({ shader: 'attention_chunks', entry: 'partial', c: { STYLE: style, QK_NORM: norm, GROUP_TILE: tile, ROW_TILE: rows } });
    }
  }
  v.push({ shader: 'attention_chunks', entry: 'combine', c: {} });
  return v;
}

test("the GPU tuning's kernels compile in Chromium within the browser's limits", { timeout: 300_000 }, async () => {
  const server = http.createServer((_, res) => res.end('<html></html>')).listen(0);
  const browser = await launch();
  try {
    const page = await browser.newPage();
    await page.goto(`http://localhost:${server.address().port}/`);
    const r = await page.evaluate(async ({ sources, variants }) => {
      const a = await navigator.gpu.requestAdapter();
      const d = await a.requestDevice({
        requiredLimits: { maxStorageBuffersPerShaderStage: Math.min(10, a.limits.maxStorageBuffersPerShaderStage) },
      });
      const errors = [];
      const modules = {};
      for (const [name, code] of Object.entries(sources)) {
        modules[name] = d.createShaderModule({ code });
        for (const m of (await modules[name].getCompilationInfo()).messages) {
          if (m.type === 'error') errors.push(`${name}:${m.lineNum}:${m.linePos}: ${m.message}`);
        }
      }
      for (const v of variants) {
        try {
          await d.createComputePipelineAsync({ layout: 'auto', compute: { module: modules[v.shader], entryPoint: v.entry, constants: v.c } });
        } catch (e) {
          errors.push(`${v.shader} ${v.entry} ${JSON.stringify(v.c)}: ${e.message}`);
        }
      }
      return { errors, storage: d.limits.maxComputeWorkgroupStorageSize };
    }, { sources, variants: variants() });
    assert.equal(r.storage, 16384, 'compiled within WebGPU\'s default 16 KiB of workgroup storage');
    assert.deepEqual(r.errors, []);
    console.log(JSON.stringify({ compiled: variants().length, workgroup_storage_limit: r.storage }));
  } finally {
    await browser.close();
    server.close();
  }
});
