// DFlash on the browser's CPU engine (wasm SIMD in a worker, threads where the page is
// cross-origin isolated) on a named shape's synthetic pair, through the package's
// `benchSynthetic`: random weights in the formats a Q4_K_M GGUF loads to, simulated
// acceptance, every DFlash output checked against plain decoding's. No model download.
//   node tests/bench/synthetic.mjs --shape qwen3-4b --layers 12 --threads 2 \
//     --accept 0.8656x15 --blocks 8,auto [--prompts 1] [--prompt-tokens 64] [--tokens 64]
// Prints the report (pkg/index.d.ts SyntheticBenchReport) with the Chromium version as
// JSON on stdout. Needs pkg/dist (scripts/build-pkg.sh) and tests/node_modules.
import { chromium } from 'playwright-core';
import { fileURLToPath } from 'node:url';
import { cpus } from 'node:os';
import { serve } from '../../www/serve.mjs';

/** `P` repeated: "0.8656x15" is fifteen 0.8656s; else comma-separated numbers. */
export function parseProfile(s) {
  const m = /^([0-9.]+)x([0-9]+)$/.exec(s);
  return m ? Array(Number(m[2])).fill(Number(m[1])) : s.split(',').map(Number);
}

/** Runs `benchSynthetic(options, { threads })` in headless Chromium on a cross-origin
 *  isolated page; resolves to { report } or { error: { code, message } }, with the
 *  browser's version. */
export async function benchInBrowser(options, { threads = 2 } = {}) {
  const srv = await serve({ port: 0 });
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  try {
    const page = await browser.newPage();
    await page.goto(`${srv.url}/tests/bench/page.html`);
    const out = await page.evaluate(async ({ options, threads }) => {
      const { benchSynthetic } = await import('/pkg/index.js');
      try {
        return { report: await benchSynthetic(options, { threads }), isolated: globalThis.crossOriginIsolated };
      } catch (e) {
        return { error: { code: e.code, message: e.message }, isolated: globalThis.crossOriginIsolated };
      }
    }, { options, threads });
    return { ...out, chromium: browser.version() };
  } finally {
    await browser.close();
    srv.server.close();
  }
}

async function main() {
  const o = { shape: 'qwen3-4b', blocks: ['8', 'auto'], acceptProfile: parseProfile('0.8656x15'), prompts: 1, promptTokens: 64, maxNewTokens: 64 };
  let threads = 2;
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i], v = () => argv[++i];
    if (a === '--shape') o.shape = v();
    else if (a === '--layers') o.layers = Number(v());
    else if (a === '--threads') threads = Number(v());
    else if (a === '--accept') o.acceptProfile = parseProfile(v());
    else if (a === '--blocks') o.blocks = v().split(',');
    else if (a === '--prompts') o.prompts = Number(v());
    else if (a === '--prompt-tokens') o.promptTokens = Number(v());
    else if (a === '--tokens') o.maxNewTokens = Number(v());
    else if (a === '--memory-budget') o.memoryBudget = Number(v());
    else throw new Error(`unknown argument ${a}`);
  }
  const r = await benchInBrowser(o, { threads });
  console.log(JSON.stringify({ options: o, threads_requested: threads, host_cpu: cpus()[0]?.model, ...r }, null, 2));
  if (r.error) process.exit(1);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) main().catch((e) => { console.error(e); process.exit(1); });
