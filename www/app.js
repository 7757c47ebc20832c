// The demo page: a model picker (the local SmolLM2-135M-Instruct with its DFlash drafter
// as www/serve.mjs serves them, the package's catalogue, or any GGUF and drafter URL),
// one progress bar for the whole load, a chat that keeps its conversation (and the
// engine's KV cache) across turns, a Stop button, a live rate from the first token, the
// tokens of accepted drafts highlighted, and on request the same turn run plainly to
// show DFlash's speedup. URL parameters set the start: model (a catalogue id, a URL, or
// none to load nothing), drafter (a folder URL or none), block, max_tokens, temperature,
// dflash=0, engine (auto, gpu, cpu), threads (the CPU engine's; more than one where the
// page is cross-origin isolated, as www/serve.mjs serves it).
import { createEngine, planModel, hasCached, CATALOG, catalogEntry } from '../pkg/index.js';

const q = new URLSearchParams(location.search);
const $ = (id) => document.getElementById(id);
const setState = (s) => { document.body.dataset.state = s; };
const LOCAL = { model: '/models/SmolLM2-135M-Instruct.Q4_1.gguf', drafter: '/drafters/smollm2-135m-instruct-dflash-b16/' };
if (q.get('block')) $('block').value = q.get('block');
if (q.get('max_tokens')) $('max_tokens').value = q.get('max_tokens');
if (q.get('dflash') === '0') $('dflash').checked = false;
const temperature = Number(q.get('temperature') ?? 0);
const ENGINE = q.get('engine') ?? 'auto';
const THREADS = q.get('threads') ? Number(q.get('threads')) : undefined;

let engine = null;
let runs = 0;
/** The conversation so far (kept in the engine's KV cache between turns). */
let messages = [];

const fmt = (x, d = 2) => (Number.isFinite(x) ? x.toFixed(d) : '–');
const gb = (b) => `${(b / 1e9).toFixed(2)} GB`;

/** The picker: local files, the catalogue, or URLs typed in. */
function fillPicker() {
  const sel = $('model');
  const add = (value, text) => { const o = document.createElement('option'); o.value = value; o.textContent = text; sel.appendChild(o); };
  add('local', 'SmolLM2 135M Instruct + our drafter (this server\'s files)');
  for (const m of CATALOG) add(m.id, `${m.name} · ${gb(m.files.reduce((a, f) => a + f.size, 0))}`);
  add('custom', 'Any GGUF URL and drafter URL…');
  const start = q.get('model');
  if (start && start !== 'none') {
    if (catalogEntry(start)) sel.value = start;
    else { sel.value = 'custom'; $('model_url').value = start; $('drafter_url').value = q.get('drafter') ?? ''; }
  } else if (q.get('drafter') === 'none') {
    sel.value = 'custom'; $('model_url').value = LOCAL.model;
  }
  showChoice();
}

/** What the picker says to load: { model, drafter } for createEngine. */
function choice() {
  const v = $('model').value;
  if (v === 'local') return { model: LOCAL.model, drafter: LOCAL.drafter };
  if (v === 'custom') return { model: $('model_url').value.trim(), drafter: $('drafter_url').value.trim() || null };
  return { model: v };
}

/** The URL fields for 'custom'; for a catalogue model, what it needs on this adapter. */
async function showChoice() {
  const v = $('model').value;
  $('urls').hidden = v !== 'custom';
  $('plan').textContent = '';
  if (v === 'local' || v === 'custom') return;
  $('plan').textContent = `checking what ${v} needs here…`;
  const cached = await hasCached(v).catch(() => false);
  try {
    const p = await planModel(v, { engine: ENGINE });
    if ($('model').value !== v) return;
    $('plan').textContent = `${gb(p.download ?? 0)} to download${cached ? ' (cached)' : ''}` +
      (p.total !== null ? `; needs ${gb(p.total)} of GPU memory at 2048 tokens` : ` (the ${p.engine} engine)`);
  } catch (e) {
    if ($('model').value === v) $('plan').textContent = `cannot run here (${e.code}): ${e.message}`;
  }
}

async function load() {
  $('load').disabled = true;
  $('send').disabled = true;
  setState('loading');
  await engine?.unload();
  engine = null;
  messages = [];
  $('history').textContent = '';
  const { model, drafter } = choice();
  try {
    engine = await createEngine({
      model, drafter, engine: ENGINE, threads: THREADS,
      onProgress: (p) => {
        const { loaded, total } = p.overall;
        $('progress').max = total || 1;
        $('progress').value = p.phase === 'build' ? total || 1 : loaded;
        $('status').textContent = p.text;
      },
    });
  } catch (e) {
    setState(e.code === 'NoWebGPU' ? 'nogpu' : 'error');
    $('status').textContent = `error (${e.code}): ${e.message}`;
    window.__error = { code: e.code, message: e.message };
    $('load').disabled = false;
    return;
  }
  const i = engine.info;
  $('status').textContent = `ready: loaded in ${fmt(i.load_s, 1)} s${i.from_cache ? ' (from cache)' : ''}; drafter ${i.drafter ? `${i.drafter.layers} layers, block ${i.drafter.block_size}` : 'none'}`;
  $('adapter').textContent = i.engine === 'cpu'
    ? `CPU engine (${i.cpu.kernel}, ${i.cpu.threads} thread${i.cpu.threads === 1 ? '' : 's'}): no hardware WebGPU adapter; context ${i.context}`
    : `adapter: ${i.adapter.name} (${i.adapter.backend}${i.adapter.shader_f16 ? ', shader-f16' : ''}), context ${i.context}`;
  $('dflash').disabled = !i.drafter;
  window.__info = i;
  $('send').disabled = false;
  $('load').disabled = false;
  setState('ready');
}

/** One streamed answer to `msgs`: pieces go to `out` (drafted ones highlighted) and the
 *  live rate in tokens (the pieces' token ids), counted from the first, to #stats. Returns { text, usage, finish }. */
async function stream(msgs, dflash, out) {
  const block = $('block').value === 'auto' ? 'auto' : Number($('block').value);
  let first = 0;
  let n = 0;
  let drafted = 0;
  let text = '';
  let usage = null;
  let finish = null;
  const req = { messages: msgs, stream: true, max_tokens: Number($('max_tokens').value), temperature, seed: 1, dflash, block };
  for await (const c of engine.chat.completions.create(req)) {
    const d = c.choices[0].delta.content;
    const ids = c.dflash?.token_ids;
    if (d || ids?.length) {
      const span = document.createElement('span');
      span.textContent = d;
      if (c.dflash?.drafted) { span.className = 'drafted'; drafted++; }
      out?.appendChild(span);
      text += d;
      const was = n;
      n += ids?.length ?? 1;
      if (was === 0) first = performance.now();
      const s = (performance.now() - first) / 1000;
      // Every step ends with one token of the target's own (the first comes from the
      // prefill), so tau is about tokens per non-drafted piece after the first.
      const steps = n - drafted - 1;
      if (out) {
        $('stats').textContent = `${n} tokens` + (n > 1 ? `, ${fmt((n - 1) / s)} tokens/s since the first` : '') +
          (dflash && steps > 0 ? `, tau ≈ ${fmt((n - 1) / steps)}, ${drafted} accepted drafts` : '');
      }
    }
    if (c.usage) { usage = c.usage; finish = c.choices[0]?.finish_reason ?? finish; }
  }
  return { text, usage, finish };
}

function addRun(label, usage) {
  const f = usage.dflash;
  const tr = document.createElement('tr');
  const cells = [`#${++runs} ${label}`, usage.completion_tokens, fmt(usage.decode_tok_s), fmt(usage.prefill_tok_s, 1),
    usage.prompt_tokens_details.cached_tokens, f.enabled ? fmt(f.mean_tau) : '–', f.enabled ? f.accepted_tokens : '–'];
  for (const c of cells) { const td = document.createElement('td'); td.textContent = c; tr.appendChild(td); }
  $('runs').querySelector('tbody').appendChild(tr);
}

async function send() {
  $('send').disabled = true;
  $('load').disabled = true;
  $('stop').disabled = false;
  $('compare_result').textContent = '';
  setState('generating');
  const out = $('output');
  out.textContent = '';
  const dflash = $('dflash').checked && !$('dflash').disabled;
  const msgs = [...messages, { role: 'user', content: $('prompt').value }];
  let r;
  try {
    r = await stream(msgs, dflash, out);
    const f = r.usage.dflash;
    $('stats').textContent = `${r.usage.completion_tokens} tokens · decode ${fmt(r.usage.decode_tok_s)} tok/s · prefill ${fmt(r.usage.prefill_tok_s, 1)} tok/s` +
      ` · ${r.usage.prompt_tokens_details.cached_tokens} of ${r.usage.prompt_tokens} prompt tokens kept from the last turn` +
      (f.enabled ? ` · DFlash block ${f.block}: mean tau ${fmt(f.mean_tau)}, ${f.accepted_tokens} accepted draft tokens` : ' · DFlash off') +
      (r.finish === 'abort' ? ' · stopped' : '');
    addRun(f.enabled ? `DFlash ${f.block}` : 'plain', r.usage);
    if (dflash && $('compare').checked && r.finish !== 'abort') {
      // The same turn again without DFlash: the same tokens (lossless), its own speed.
      $('compare_result').textContent = 'running the same turn without DFlash…';
      const plain = await stream(msgs, false, null);
      addRun('plain (comparison)', plain.usage);
      const x = r.usage.decode_tok_s / plain.usage.decode_tok_s;
      $('compare_result').textContent = `DFlash ${fmt(x)}× plain decoding (${fmt(r.usage.decode_tok_s)} vs ${fmt(plain.usage.decode_tok_s)} tok/s)` +
        (plain.text === r.text ? ', the same text' : ', DIFFERENT TEXT');
      window.__compare = { speedup: x, same: plain.text === r.text };
    }
  } catch (e) {
    $('stats').textContent = `error (${e.code}): ${e.message}`;
    window.__error = { code: e.code, message: e.message };
    setState('error');
    $('send').disabled = false;
    $('load').disabled = false;
    $('stop').disabled = true;
    return;
  }
  messages = [...msgs, { role: 'assistant', content: r.text }];
  const turn = document.createElement('div');
  turn.className = 'turn';
  turn.textContent = `you: ${msgs.at(-1).content}\nmodel: ${r.text}`;
  $('history').appendChild(turn);
  window.__last = { text: r.text, usage: r.usage, finish_reason: r.finish };
  $('send').disabled = false;
  $('load').disabled = false;
  $('stop').disabled = true;
  setState('done');
}

async function newChat() {
  messages = [];
  $('history').textContent = '';
  $('output').textContent = '';
  await engine?.resetChat();
}

$('model').addEventListener('change', showChoice);
$('load').addEventListener('click', load);
$('send').addEventListener('click', send);
$('stop').addEventListener('click', () => engine?.interrupt());
$('newchat').addEventListener('click', newChat);
fillPicker();
if (q.get('model') === 'none') setState('idle');
else load();
