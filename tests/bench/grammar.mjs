// What a grammar costs: SmolLM2-135M with its DFlash drafter on the CPU engine, natively
// (`dflash generate`, 2 threads) and in headless Chromium (the npm package's wasm CPU
// engine in a worker, threads on), each prompt answered four ways: unconstrained and
// under its JSON schema, DFlash off and on (`block: auto`). Decode tok/s is the tokens
// after the first over the decode time, summed over the prompts. The outputs differ
// (JSON against free text), so the ratios compare what a user gets: constrained
// decoding's tok/s over unconstrained decoding's, and DFlash's speedup under the
// grammar against its speedup without.
//   node tests/bench/grammar.mjs [--tokens 96] [--skip-browser]
// Prints one JSON object. Needs pkg/dist (scripts/build-pkg.sh), target/release/dflash,
// tests/bench/node_modules and the SmolLM2 model in the cache.
import { chromium } from 'playwright-core';
import { execFileSync } from 'node:child_process';
import { writeFileSync, mkdtempSync } from 'node:fs';
import { join, dirname } from 'node:path';
import { tmpdir, homedir } from 'node:os';
import { fileURLToPath } from 'node:url';
import { serve } from '../../www/serve.mjs';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const CACHE = process.env.DFLASH_CACHE ?? join(homedir(), '.cache', 'dflash');
const MODEL_FILE = 'SmolLM2-135M-Instruct.Q4_1.gguf';
const DRAFTER = 'drafters/smollm2-135m-instruct-dflash-b16';

const obj = (properties, required = Object.keys(properties)) => ({ type: 'object', properties, required, additionalProperties: false });
const CASES = [
  ['Describe a cat as JSON with its name, age and whether it lives indoors.', obj({ name: { type: 'string' }, age: { type: 'integer' }, indoor: { type: 'boolean' } })],
  ['Give the weather forecast for Paris tomorrow as JSON.', obj({ city: { type: 'string' }, temperature_c: { type: 'number' }, conditions: { type: 'string' }, rain: { type: 'boolean' } })],
  ['Invent a user profile as JSON: name, email, age and a list of hobbies.', obj({ name: { type: 'string' }, email: { type: 'string' }, age: { type: 'integer' }, hobbies: { type: 'array', items: { type: 'string' } } })],
  ['Write a book record as JSON with title, author, year and genres.', obj({ title: { type: 'string' }, author: { type: 'string' }, year: { type: 'integer' }, genres: { type: 'array', items: { type: 'string' } } })],
  ['Return a JSON object for a product: its name, price, currency and whether it is in stock.', obj({ name: { type: 'string' }, price: { type: 'number' }, currency: { type: 'string', enum: ['USD', 'EUR', 'GBP'] }, in_stock: { type: 'boolean' } })],
  ['Describe a recipe for pancakes as JSON with a title, servings and a list of ingredients.', obj({ title: { type: 'string' }, servings: { type: 'integer' }, ingredients: { type: 'array', items: obj({ item: { type: 'string' }, amount: { type: 'string' } }) } })],
  ['List three planets as JSON, each with its name and whether it has rings.', obj({ planets: { type: 'array', items: obj({ name: { type: 'string' }, rings: { type: 'boolean' } }) } })],
  ['Summarise a meeting as JSON: the date, attendees and action items.', obj({ date: { type: 'string' }, attendees: { type: 'array', items: { type: 'string' } }, actions: { type: 'array', items: { type: 'string' } } })],
];
const MODES = [['plain', false, false], ['json', false, true], ['dflash', true, false], ['dflash_json', true, true]];

function parseArgs() {
  const a = { tokens: 96, browser: true };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--tokens') a.tokens = Number(argv[++i]);
    else if (argv[i] === '--skip-browser') a.browser = false;
    else throw new Error(`unknown argument ${argv[i]}`);
  }
  return a;
}

/** Sums of (tokens after the first, decode seconds, steps, accepted) per mode. */
function totals(runs) {
  const out = {};
  for (const [mode] of MODES) {
    const rs = runs.filter((r) => r.mode === mode);
    const tokens = rs.reduce((s, r) => s + Math.max(0, r.tokens - 1), 0);
    const seconds = rs.reduce((s, r) => s + r.decode_s, 0);
    out[mode] = { tokens, decode_s: seconds, tok_s: tokens / seconds, valid: rs.filter((r) => r.valid).length, answers: rs.length };
  }
  const t = (m) => out[m].tok_s;
  return {
    modes: out,
    grammar_ratio_plain: t('json') / t('plain'),
    grammar_ratio_dflash: t('dflash_json') / t('dflash'),
    dflash_speedup: t('dflash') / t('plain'),
    dflash_speedup_json: t('dflash_json') / t('json'),
  };
}

function native(tokens) {
  const dir = mkdtempSync(join(tmpdir(), 'dflash-grammar-bench-'));
  const runs = [];
  CASES.forEach(([prompt, schema], i) => {
    const file = join(dir, `${i}.json`);
    writeFileSync(file, JSON.stringify(schema));
    for (const [mode, dflash, json] of MODES) {
      const args = ['generate', '--model', join(CACHE, 'models', MODEL_FILE), '--chat', prompt, '--max-new-tokens', String(tokens),
        '--json', '--device', 'cpu', ...(dflash ? ['--drafter', join(ROOT, DRAFTER)] : []), ...(json ? ['--json-schema', file] : [])];
      const r = JSON.parse(execFileSync(join(ROOT, 'target', 'release', 'dflash'), args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }));
      runs.push({ mode, tokens: r.completion_tokens, decode_s: r.timings.decode_s, valid: json ? isJson(r.text) : null });
    }
  });
  return totals(runs);
}

function isJson(text) {
  try { JSON.parse(text); return true; } catch { return false; }
}

async function browser(tokens) {
  const srv = await serve({ port: 0 });
  const b = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium', headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  try {
    const page = await b.newPage();
    await page.goto(`${srv.url}/tests/bench/page.html`);
    const runs = await page.evaluate(async ({ model, drafter, CASES, MODES, tokens }) => {
      const { createEngine } = await import('/pkg/index.js');
      const engine = await createEngine({ model, drafter, engine: 'cpu', threads: 2 });
      const runs = [];
      for (const [prompt, schema] of CASES) {
        for (const [mode, dflash, json] of MODES) {
          engine.resetChat();
          const r = await engine.chat.completions.create({
            messages: [{ role: 'user', content: prompt }], max_tokens: tokens, temperature: 0, dflash,
            ...(json ? { response_format: { type: 'json_schema', json_schema: { name: 'x', schema, strict: true } } } : {}),
          });
          let valid = null;
          if (json) { try { JSON.parse(r.choices[0].message.content); valid = true; } catch { valid = false; } }
          runs.push({ mode, tokens: r.usage.completion_tokens, decode_s: r.usage.decode_s, valid });
        }
      }
      const info = engine.info;
      await engine.unload();
      return { runs, cpu: info.cpu, isolated: globalThis.crossOriginIsolated };
    }, { model: `/models/${MODEL_FILE}`, drafter: `/${DRAFTER}/`, CASES, MODES, tokens });
    return { ...totals(runs.runs), cpu: runs.cpu, isolated: runs.isolated, chromium: b.version() };
  } finally {
    await b.close();
    srv.server.close();
  }
}

const a = parseArgs();
const commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: ROOT, encoding: 'utf8' }).trim();
const report = { bench: 'grammar', commit, model: MODEL_FILE, drafter: DRAFTER, prompts: CASES.length, max_tokens: a.tokens, native: native(a.tokens) };
if (a.browser) report.browser = await browser(a.tokens);
console.log(JSON.stringify(report));
