// Browser CPU benchmark: wllama (npm @wllama/wllama, llama.cpp compiled to wasm) or our
// pkg/ (dflash-web), in Debian's headless chromium, on the prompts `dflash bench` uses.
//
//   (cd tests/bench && npm ci)
//   node tests/bench/wllama.mjs [--engine wllama|dflash] [--threads N] [--prompts 8] [--tokens 32]
//        [--model PATH.gguf] [--prompt-file fixtures/prompts/chat20.jsonl] [--coi|--no-coi]
//        [--ctx 2048] [--no-warmup] [--dflash-engine cpu|none] [--texts]
//
// Each line of the prompt file is JSON with `chat` (one user message, rendered by the
// model's own chat template inside the engine) or `prompt` (raw text). Decoding is greedy
// (temperature 0, top_k 1), with no prompt-cache reuse between prompts, and with EOS
// ignored where the engine allows it (`ignore_eos_honoured` says whether every prompt
// decoded exactly --tokens tokens). One warm-up request runs first and is not counted.
// Prints one JSON object on stdout (progress on stderr).
//
// Threads: wllama runs single-threaded unless the page is cross-origin isolated
// (COOP/COEP headers) and n_threads > 1. The server sends those headers when --threads > 1
// (or with --coi); the output says what wllama actually used.
import { chromium } from 'playwright-core';
import { createServer } from 'node:http';
import { createReadStream, readFileSync, statSync, existsSync } from 'node:fs';
import { join, normalize, extname, resolve, dirname, basename } from 'node:path';
import { homedir, cpus, loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '..', '..');
const CACHE = process.env.DFLASH_CACHE ?? join(homedir(), '.cache', 'dflash');

function args(argv) {
  const o = {
    engine: 'wllama', threads: 1, prompts: 8, tokens: 32, ctx: 2048, warmup: true, coi: null, texts: false,
    model: join(CACHE, 'models', 'SmolLM2-135M-Instruct.Q4_1.gguf'),
    promptFile: join(ROOT, 'fixtures', 'prompts', 'chat20.jsonl'),
    dflashEngine: 'cpu',
  };
  for (let i = 2; i < argv.length; i++) {
    const a = argv[i], v = () => argv[++i];
    if (a === '--engine') o.engine = v();
    else if (a === '--threads') o.threads = Number(v());
    else if (a === '--prompts') o.prompts = Number(v());
    else if (a === '--tokens') o.tokens = Number(v());
    else if (a === '--ctx') o.ctx = Number(v());
    else if (a === '--model') o.model = resolve(v());
    else if (a === '--prompt-file') o.promptFile = resolve(v());
    else if (a === '--coi') o.coi = true;
    else if (a === '--no-coi') o.coi = false;
    else if (a === '--no-warmup') o.warmup = false;
    else if (a === '--texts') o.texts = true;
    else if (a === '--dflash-engine') { const e = v(); o.dflashEngine = e === 'none' ? null : e; }
    else if (a === '-h' || a === '--help') { console.log(readFileSync(fileURLToPath(import.meta.url), 'utf8').split('\nimport ')[0]); process.exit(0); }
    else throw new Error(`unknown argument ${a}`);
  }
  if (!['wllama', 'dflash'].includes(o.engine)) throw new Error('--engine is wllama or dflash');
  o.coi ??= o.threads > 1;
  return o;
}

const TYPES = {
  '.html': 'text/html; charset=utf-8', '.js': 'text/javascript', '.mjs': 'text/javascript',
  '.json': 'application/json', '.wasm': 'application/wasm',
};

/** A static server on 127.0.0.1: the repository at /, the model at /model/<name>; with
 *  `coi` every response carries COOP/COEP (cross-origin isolation, SharedArrayBuffer). */
function serve({ model, coi }) {
  const server = createServer((req, res) => {
    const path = decodeURIComponent(new URL(req.url, 'http://x').pathname);
    const file = path === `/model/${basename(model)}` ? model : join(ROOT, normalize(path));
    const headers = { 'cache-control': 'no-cache' };
    if (coi) {
      headers['cross-origin-opener-policy'] = 'same-origin';
      headers['cross-origin-embedder-policy'] = 'require-corp';
      headers['cross-origin-resource-policy'] = 'same-origin';
    }
    let st;
    try {
      if (file !== model && !file.startsWith(ROOT + '/')) throw new Error('outside');
      st = statSync(file);
      if (!st.isFile()) throw new Error('not a file');
    } catch {
      res.writeHead(404, { ...headers, 'content-type': 'text/plain' });
      return res.end(`not found: ${path}`);
    }
    res.writeHead(200, { ...headers, 'content-type': TYPES[extname(file)] ?? 'application/octet-stream', 'content-length': st.size });
    if (req.method === 'HEAD') return res.end();
    createReadStream(file).pipe(res);
  });
  return new Promise((ok) => server.listen(0, '127.0.0.1', () => ok({ server, url: `http://127.0.0.1:${server.address().port}` })));
}

const round = (x, d = 2) => (x == null || !Number.isFinite(x) ? x : Math.round(x * 10 ** d) / 10 ** d);

async function main() {
  const o = args(process.argv);
  if (!existsSync(o.model)) throw new Error(`missing model ${o.model}: run scripts/fetch-models.sh smollm2`);
  const rows = readFileSync(o.promptFile, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l)).slice(0, o.prompts);
  const wllamaDir = join(HERE, 'node_modules', '@wllama', 'wllama');
  let wllamaVersion = null;
  if (o.engine === 'wllama') {
    if (!existsSync(join(wllamaDir, 'esm', 'index.js'))) throw new Error('missing @wllama/wllama: run (cd tests/bench && npm ci)');
    wllamaVersion = JSON.parse(readFileSync(join(wllamaDir, 'package.json'), 'utf8')).version;
  } else if (!existsSync(join(ROOT, 'pkg', 'dist', 'dflash_web_bg.wasm'))) {
    throw new Error('missing pkg/dist/dflash_web_bg.wasm: run scripts/build-pkg.sh');
  }

  const { server, url } = await serve({ model: o.model, coi: o.coi });
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    // the flags of tests/e2e/common.mjs; WebGPU (SwiftShader) only for our pkg, whose
    // GPU build needs it; wllama is told n_gpu_layers: 0 anyway
    args: [...(o.engine === 'dflash' && o.dflashEngine !== 'cpu' ? ['--enable-unsafe-webgpu'] : []),
      '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  try {
    const page = await browser.newPage();
    const errors = [];
    page.on('pageerror', (e) => errors.push(e.message));
    page.on('console', (m) => { if (m.type() === 'error' && !/Failed to load resource/.test(m.text())) errors.push(m.text()); });
    page.on('response', (res) => { if (res.status() >= 400 && !res.url().endsWith('/favicon.ico')) errors.push(`${res.status()} ${res.url()}`); });
    await page.goto(`${url}/tests/bench/page.html`);
    await page.waitForFunction(() => window.benchReady === true, null, { timeout: 30_000 });
    console.error(`[bench] ${o.engine}: ${rows.length} prompts x ${o.tokens} tokens, threads ${o.threads}, cross-origin isolated: ${o.coi}`);
    const t0 = Date.now();
    const load0 = loadavg().map((x) => round(x));
    const r = await page.evaluate((opts) => window.bench.run(opts), {
      engine: o.engine,
      wllamaBase: '/tests/bench/node_modules/@wllama/wllama/esm/',
      pkgUrl: '/pkg/index.js',
      modelUrl: `/model/${basename(o.model)}`,
      rows, tokens: o.tokens, threads: o.threads, nCtx: o.ctx, warmup: o.warmup, dflashEngine: o.dflashEngine,
    });
    console.error(`[bench] done in ${((Date.now() - t0) / 1e3).toFixed(1)} s`);

    const per = r.per;
    const sum = (f) => per.reduce((s, p) => s + f(p), 0);
    const pn = sum((p) => p.prompt_tokens), dn = sum((p) => p.completion_tokens);
    const out = {
      engine: r.info.engine,
      ...(wllamaVersion ? { wllama: wllamaVersion, libllama: r.info.libllama } : {}),
      chromium: browser.version(),
      threads_requested: o.threads,
      threads: r.info.threads ?? r.info.engine_info?.cpu?.threads ?? null,
      multithread: r.info.multithread ?? (r.info.engine_info?.cpu ? r.info.engine_info.cpu.threads > 1 : null),
      cross_origin_isolated: r.info.cross_origin_isolated,
      hardware_concurrency: r.info.hardware_concurrency,
      // other work on the machine skews the numbers: the 1-minute load average before and after
      host: { cpus: cpus().length, cpu: cpus()[0]?.model, loadavg_before: load0, loadavg_after: loadavg().map((x) => round(x)) },
      model: o.model,
      prompts: per.length,
      max_new_tokens: o.tokens,
      warmup: o.warmup,
      load_s: round(r.info.load_s, 3),
      prefill_tokens: pn,
      prefill_tok_s: round(pn / sum((p) => p.prefill_s)),
      decode_tokens: dn,
      // (completion_tokens - 1) / decode time, summed over prompts: the first token of
      // each answer comes out of prefill (the definition of pkg/'s usage.decode_tok_s)
      decode_tok_s: round(sum((p) => p.completion_tokens - 1) / sum((p) => p.decode_s)),
      // llama.cpp's own definition (predicted_n / predicted_ms), as scripts/bench-llamacpp.py prints
      ...(r.info.engine === 'wllama' ? { decode_tok_s_llama: round(dn / sum((p) => p.decode_s)) } : {}),
      wall_clock: {
        prefill_tok_s: round(pn / sum((p) => p.wall.first_piece_s)),
        decode_tok_s: round(sum((p) => p.pieces - 1) / sum((p) => p.wall.first_to_last_s)),
        note: 'request start -> first streamed piece; (pieces - 1) / first -> last piece',
      },
      // wllama is asked for ignore_eos (llama.cpp's sampling option); our pkg's API has no
      // such option, so there a prompt may stop early at EOS
      ignore_eos_requested: r.info.engine === 'wllama',
      ignore_eos_honoured: r.info.engine === 'wllama' ? per.every((p) => p.completion_tokens === o.tokens) : null,
      all_prompts_decoded_max_tokens: per.every((p) => p.completion_tokens === o.tokens),
      timing_source: [...new Set(per.map((p) => p.timing_source))].join(', '),
      per_prompt: per.map((p) => ({
        id: p.id, prompt_tokens: p.prompt_tokens, completion_tokens: p.completion_tokens,
        prefill_ms: round(p.prefill_s * 1e3, 1), prefill_tok_s: round(p.prefill_tok_s),
        decode_ms: round(p.decode_s * 1e3, 1), decode_tok_s: round(p.decode_tok_s),
        wall_first_piece_ms: round(p.wall.first_piece_s * 1e3, 1), pieces: p.pieces, finish_reason: p.finish_reason,
        ...(p.llama_timings ? { cache_n: p.llama_timings.cache_n } : {}),
        ...(o.texts ? { text: p.text } : {}),
      })),
      ...(r.info.engine_info ? { engine_option: r.info.engine_option, engine_info: r.info.engine_info } : {}),
      ...(errors.length ? { page_errors: errors.slice(0, 20) } : {}),
    };
    console.log(JSON.stringify(out, null, 2));
  } finally {
    await browser.close();
    server.close();
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
