// `dflash serve` called from web pages in headless Chromium: a page on the origin given
// to --cors-origin gets its answer (the browser's preflight for a JSON POST with an API
// key passes), streamed too, and through the official `openai` npm client running in the
// page; a page on another origin is refused by the browser.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { join } from 'node:path';
import { serve } from '../../www/serve.mjs';
import { ROOT, launch, watch, MODEL } from './common.mjs';

let page, api, browser, server;

/** Starts `dflash serve` with the given flags; resolves to its base URL. */
function startApi(flags) {
  server = spawn(join(ROOT, 'target', 'release', 'dflash'), ['serve', '--model', MODEL, '--device', 'cpu', '--port', '0', ...flags], { stdio: ['ignore', 'ignore', 'pipe'] });
  return new Promise((resolve, reject) => {
    const lines = createInterface({ input: server.stderr });
    lines.on('line', (l) => { const m = l.match(/listening on (http:\/\/\S+)$/); if (m) resolve(m[1]); });
    server.on('exit', (code) => reject(new Error(`dflash serve exited with ${code}`)));
  });
}

before(async () => {
  page = await serve({ port: 0, isolated: false });
  api = await startApi(['--cors-origin', page.url, '--api-key', 'sk-e2e']);
  browser = await launch({ webgpu: false });
});
after(async () => { await browser?.close(); page?.server.close(); server?.kill(); });

/** From a page at `origin`: a chat completion with the key, whole or streamed. */
async function callFrom(origin, stream) {
  const p = await (await browser.newContext()).newPage();
  watch(p, `cors ${origin}`);
  await p.goto(`${origin}/www/index.html?model=none`);
  return p.evaluate(async ({ api, stream }) => {
    try {
      const r = await fetch(`${api}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', Authorization: 'Bearer sk-e2e' },
        body: JSON.stringify({ messages: [{ role: 'user', content: 'Say hello.' }], max_tokens: 6, temperature: 0, stream }),
      });
      return { status: r.status, body: await r.text() };
    } catch (e) {
      return { error: String(e) };
    }
  }, { api, stream });
}

test('a page on the allowed origin gets its answer, another origin is refused', { timeout: 120_000 }, async () => {
  const whole = await callFrom(page.url, false);
  assert.equal(whole.status, 200, JSON.stringify(whole));
  assert.equal(JSON.parse(whole.body).usage.completion_tokens, 6);
  const streamed = await callFrom(page.url, true);
  assert.equal(streamed.status, 200, JSON.stringify(streamed));
  assert.match(streamed.body, /data: \[DONE\]/);
  // The same page server reached as localhost is another origin.
  const other = await callFrom(page.url.replace('127.0.0.1', 'localhost'), false);
  assert.match(other.error ?? '', /Failed to fetch/, JSON.stringify(other));
  const metrics = await (await fetch(`${api}/metrics`)).text();
  assert.match(metrics, /dflash_requests_served_total [2-9]\b/, metrics);
});

test("the official openai npm client in a page calls the server across origins, whole and streamed", { timeout: 120_000 }, async () => {
  const p = await (await browser.newContext()).newPage();
  watch(p, 'openai-npm');
  await p.goto(`${page.url}/www/index.html?model=none`);
  const r = await p.evaluate(async ({ api }) => {
    const { default: OpenAI } = await import('/tests/node_modules/openai/index.mjs');
    const client = new OpenAI({ baseURL: `${api}/v1`, apiKey: 'sk-e2e', dangerouslyAllowBrowser: true });
    const models = (await client.models.list()).data.map((m) => m.id);
    const ask = { model: models[0], messages: [{ role: 'user', content: 'Say hello.' }], max_tokens: 6, temperature: 0 };
    const whole = await client.chat.completions.create(ask);
    let streamed = '';
    for await (const c of await client.chat.completions.create({ ...ask, stream: true })) streamed += c.choices[0]?.delta?.content ?? '';
    let refused = null;
    try {
      await new OpenAI({ baseURL: `${api}/v1`, apiKey: 'sk-wrong', dangerouslyAllowBrowser: true, maxRetries: 0 }).models.list();
    } catch (e) {
      refused = e.status;
    }
    return { models, whole: whole.choices[0].message.content, tokens: whole.usage.completion_tokens, streamed, refused };
  }, { api });
  console.log(JSON.stringify(r));
  assert.deepEqual(r.models, ['SmolLM2-135M-Instruct.Q4_1']);
  assert.equal(r.tokens, 6);
  assert.equal(r.streamed, r.whole, 'streamed text equals the whole answer');
  assert.equal(r.refused, 401);
});
