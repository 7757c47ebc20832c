// The browser side of tests/bench/wllama.mjs: loads one engine (wllama, or our pkg/),
// runs one untimed warm-up request, then the prompts one after another, greedy, and
// returns per-prompt timings. Every request is streamed, so the wall clock (request
// start -> first piece -> last piece) is measured the same way for both engines; the
// engine's own timings are kept beside it and preferred where it has them.
//
//   prefill_s = engine's prompt time (wall clock fallback: request start -> first piece)
//   decode_s  = engine's generation time (fallback: first piece -> last piece)
//   decode tok/s = (completion_tokens - 1) / decode_s  (the first token comes out of prefill)

const now = () => performance.now();

/** Streams one request through `iterate` (an async iterable of chunks) and times it. */
async function timed(start, pieceOf) {
  const t0 = now();
  const it = await start();
  let tFirst = null, tLast = null, pieces = 0, text = '', last = null, finish = null, timings = null, usage = null;
  for await (const c of it) {
    const piece = pieceOf(c);
    if (piece) {
      const t = now();
      tFirst ??= t;
      tLast = t;
      pieces++;
      text += piece;
    }
    const f = c?.choices?.[0]?.finish_reason;
    if (f) finish = f;
    if (c?.timings) timings = c.timings;
    if (c?.usage) usage = c.usage;
    last = c;
  }
  const tEnd = now();
  return {
    text, pieces, finish, timings, usage, last,
    wall: {
      total_s: (tEnd - t0) / 1e3,
      first_piece_s: tFirst == null ? null : (tFirst - t0) / 1e3,
      first_to_last_s: tFirst == null ? null : (tLast - tFirst) / 1e3,
    },
  };
}

function row(id, promptN, completionN, prefillS, decodeS, source, extra) {
  return {
    id,
    prompt_tokens: promptN,
    completion_tokens: completionN,
    prefill_s: prefillS,
    decode_s: decodeS,
    prefill_tok_s: promptN / prefillS,
    decode_tok_s: (completionN - 1) / decodeS,
    timing_source: source,
    ...extra,
  };
}

// ---------------------------------------------------------------- wllama

async function runWllama({ wllamaBase, modelUrl, rows, tokens, threads, nCtx, warmup }) {
  const { Wllama } = await import(wllamaBase + 'index.js');
  const logs = [];
  const keep = (level) => (...a) => logs.push(`[${level}] ${a.map(String).join(' ')}`.slice(0, 400));
  const logger = { debug: () => {}, log: keep('log'), warn: keep('warn'), error: keep('error') };
  const w = new Wllama({ default: wllamaBase + 'wasm/wllama.wasm' }, { logger });

  const tLoad = now();
  const blob = await (await fetch(modelUrl)).blob();
  await w.loadModel([blob], {
    n_threads: threads,   // wllama only goes multi-threaded when crossOriginIsolated and n_threads > 1
    n_gpu_layers: 0,      // CPU (wasm SIMD) only: no WebGPU offload
    n_ctx: nCtx,
    n_parallel: 1,        // one slot, as scripts/bench-llamacpp.py
  });
  const loadS = (now() - tLoad) / 1e3;

  const common = {
    max_tokens: tokens, n_predict: tokens,
    temperature: 0, top_k: 1,
    cache_prompt: false,  // no prefix reuse between prompts: every prefill is measured in full
    ignore_eos: true,
    stream: true,
  };
  const request = (r) => r.chat != null
    ? timed(() => w.createChatCompletion({ messages: [{ role: 'user', content: r.chat }], ...common }), (c) => c?.choices?.[0]?.delta?.content)
    : timed(() => w.createCompletion({ prompt: r.prompt, ...common }), (c) => c?.choices?.[0]?.text);

  if (warmup) await request(rows[0]);
  const per = [];
  for (const [i, r] of rows.entries()) {
    const res = await request(r);
    const t = res.timings;
    const id = r.id ?? String(i + 1);
    const extra = {
      finish_reason: res.finish,
      pieces: res.pieces,
      wall: res.wall,
      llama_timings: t,
      text: res.text,
    };
    if (t && t.prompt_n > 0 && t.predicted_n > 1) {
      per.push(row(id, t.prompt_n, t.predicted_n, t.prompt_ms / 1e3, t.predicted_ms / 1e3, 'llama.cpp timings', extra));
    } else {
      const n = res.usage?.completion_tokens ?? res.pieces;
      per.push(row(id, res.usage?.prompt_tokens ?? NaN, n, res.wall.first_piece_s, res.wall.first_to_last_s, 'wall clock', extra));
    }
  }
  const info = {
    engine: 'wllama',
    libllama: typeof Wllama.getLibllamaVersion === 'function' ? Wllama.getLibllamaVersion() : null,
    multithread: w.isMultithread(),
    threads: w.getNumThreads(),
    cross_origin_isolated: globalThis.crossOriginIsolated === true,
    hardware_concurrency: navigator.hardwareConcurrency,
    load_s: loadS,
    context: w.getLoadedContextInfo?.()?.n_ctx,
    chat_template_in_gguf: !!w.getChatTemplate?.(),
  };
  await w.exit?.();
  return { info, per, logs: logs.slice(-40) };
}

// ---------------------------------------------------------------- dflash-web (our pkg/)

async function runDflash({ pkgUrl, modelUrl, rows, tokens, threads, nCtx, warmup, dflashEngine }) {
  const { createEngine } = await import(pkgUrl);
  const tLoad = now();
  // threads > 1 runs where the page is cross-origin isolated (the harness's --coi)
  const options = { model: modelUrl, context: nCtx, threads };
  // engine: 'cpu' (the quantized wasm SIMD engine), 'gpu' or 'auto' (pkg/index.d.ts);
  // info.engine and info.cpu ({ kernel, threads }) say what runs
  if (dflashEngine) options.engine = dflashEngine;
  const engine = await createEngine(options);
  const loadS = (now() - tLoad) / 1e3;

  const request = (r) => timed(
    () => engine.chat.completions.create({
      // our API has no raw-completion call: a `prompt` row is sent as the user message
      messages: [{ role: 'user', content: r.chat ?? r.prompt }],
      max_tokens: tokens,
      temperature: 0,
      stream: true,
    }),
    (c) => c?.choices?.[0]?.delta?.content,
  );

  if (warmup) await request(rows[0]);
  const per = [];
  for (const [i, r] of rows.entries()) {
    const res = await request(r);
    const u = res.usage; // Usage of pkg/index.d.ts, on the last chunk
    const id = r.id ?? String(i + 1);
    const extra = {
      finish_reason: res.finish,
      pieces: res.pieces,
      wall: res.wall,
      dflash_usage: u,
      raw_prompt_as_chat: r.chat == null,
      text: res.text,
    };
    if (u && u.prefill_s > 0 && u.decode_s > 0) {
      per.push(row(id, u.prompt_tokens, u.completion_tokens, u.prefill_s, u.decode_s, 'dflash usage', extra));
    } else {
      per.push(row(id, u?.prompt_tokens ?? NaN, u?.completion_tokens ?? res.pieces, res.wall.first_piece_s, res.wall.first_to_last_s, 'wall clock', extra));
    }
  }
  const info = {
    engine: 'dflash-web',
    engine_option: dflashEngine ?? null,
    cross_origin_isolated: globalThis.crossOriginIsolated === true,
    hardware_concurrency: navigator.hardwareConcurrency,
    load_s: loadS,
    engine_info: engine.info,
  };
  await engine.unload();
  return { info, per, logs: [] };
}

export async function run(options) {
  if (options.engine === 'wllama') return runWllama(options);
  if (options.engine === 'dflash') return runDflash(options);
  throw new Error(`unknown engine ${options.engine}`);
}
