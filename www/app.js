// The demo page: loads the default model (SmolLM2-135M-Instruct) and its DFlash drafter
// through the npm package's API, streams chat answers with live tok/s and tau, and
// highlights the tokens that came from accepted drafts. URL parameters override the
// defaults: model, drafter, block, max_tokens, temperature, dflash=0, engine (auto, gpu,
// cpu), threads (the CPU engine's; more than one where the page is cross-origin
// isolated, as www/serve.mjs serves it).
import { createEngine } from '../pkg/index.js';

const q = new URLSearchParams(location.search);
const $ = (id) => document.getElementById(id);
const setState = (s) => { document.body.dataset.state = s; };
const MODEL = q.get('model') ?? '/models/SmolLM2-135M-Instruct.Q4_1.gguf';
const DRAFTER = q.get('drafter') ?? '/drafters/smollm2-135m-instruct-dflash-b16/';
if (q.get('block')) $('block').value = q.get('block');
if (q.get('max_tokens')) $('max_tokens').value = q.get('max_tokens');
if (q.get('dflash') === '0') $('dflash').checked = false;
const temperature = Number(q.get('temperature') ?? 0);
const ENGINE = q.get('engine') ?? 'auto';
const THREADS = q.get('threads') ? Number(q.get('threads')) : undefined;

let engine = null;
let runs = 0;

function fmt(x, d = 2) { return Number.isFinite(x) ? x.toFixed(d) : '–'; }

async function main() {
  const mb = (b) => (b / 1e6).toFixed(1);
  try {
    engine = await createEngine({
      model: MODEL,
      drafter: DRAFTER === 'none' ? undefined : DRAFTER,
      engine: ENGINE,
      threads: THREADS,
      onProgress: (p) => {
        $('progress').max = p.total || 1;
        $('progress').value = p.total ? p.loaded : 1;
        $('status').textContent = p.phase === 'build' ? 'building the model…' : `${p.phase === 'cache' ? 'from cache' : 'downloading'} ${p.file}: ${mb(p.loaded)} / ${mb(p.total)} MB`;
      },
    });
  } catch (e) {
    setState(e.code === 'NoWebGPU' ? 'nogpu' : 'error');
    $('status').textContent = `error (${e.code}): ${e.message}`;
    window.__error = { code: e.code, message: e.message };
    return;
  }
  const i = engine.info;
  $('status').textContent = `ready: loaded in ${fmt(i.load_s, 1)} s${i.from_cache ? ' (from cache)' : ''}; drafter ${i.drafter ? `${i.drafter.layers} layers, block ${i.drafter.block_size}` : 'none'}`;
  $('adapter').textContent = i.engine === 'cpu'
    ? `CPU engine (${i.cpu.kernel}, ${i.cpu.threads} thread${i.cpu.threads === 1 ? '' : 's'}): no hardware WebGPU adapter; context ${i.context}`
    : `adapter: ${i.adapter.name} (${i.adapter.backend}${i.adapter.shader_f16 ? ', shader-f16' : ''}), context ${i.context}`;
  window.__info = i;
  $('send').disabled = false;
  setState('ready');
}

async function send() {
  $('send').disabled = true;
  setState('generating');
  const out = $('output');
  out.textContent = '';
  const dflash = $('dflash').checked;
  const block = $('block').value === 'auto' ? 'auto' : Number($('block').value);
  const t0 = performance.now();
  let n = 0;
  let drafted = 0;
  let usage = null;
  let text = '';
  try {
    const stream = engine.chat.completions.create({
      messages: [{ role: 'user', content: $('prompt').value }],
      stream: true, max_tokens: Number($('max_tokens').value), temperature, seed: 1, dflash, block,
    });
    for await (const c of stream) {
      const d = c.choices[0].delta.content;
      if (d) {
        const span = document.createElement('span');
        span.textContent = d;
        if (c.dflash?.drafted) { span.className = 'drafted'; drafted++; }
        out.appendChild(span);
        text += d;
        n++;
        const s = (performance.now() - t0) / 1000;
        // Live: every step ends with one token of the target's own (the first comes from
        // the prefill), so tau is about pieces per non-drafted piece after the first.
        const steps = n - drafted - 1;
        $('stats').textContent = `${n} pieces, ${fmt(n / s)} pieces/s` + (dflash && steps > 0 ? `, tau ≈ ${fmt((n - 1) / steps)}, ${drafted} accepted drafts` : '');
      }
      if (c.usage) usage = c.usage;
    }
  } catch (e) {
    $('stats').textContent = `error (${e.code}): ${e.message}`;
    window.__error = { code: e.code, message: e.message };
    setState('error');
    $('send').disabled = false;
    return;
  }
  const f = usage.dflash;
  $('stats').textContent = `${usage.completion_tokens} tokens · decode ${fmt(usage.decode_tok_s)} tok/s · prefill ${fmt(usage.prefill_tok_s, 1)} tok/s` +
    (f.enabled ? ` · DFlash block ${f.block}: mean tau ${fmt(f.mean_tau)}, ${f.accepted_tokens} accepted draft tokens` : ' · DFlash off');
  const tr = document.createElement('tr');
  const cells = [`#${++runs} ${f.enabled ? 'DFlash ' + f.block : 'plain'}`, usage.completion_tokens, fmt(usage.decode_tok_s), fmt(usage.prefill_tok_s, 1), f.enabled ? fmt(f.mean_tau) : '–', f.enabled ? f.accepted_tokens : '–'];
  for (const c of cells) { const td = document.createElement('td'); td.textContent = c; tr.appendChild(td); }
  $('runs').querySelector('tbody').appendChild(tr);
  window.__last = { text, usage };
  $('send').disabled = false;
  setState('done');
}

$('send').addEventListener('click', send);
main();
