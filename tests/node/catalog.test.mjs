// The catalogue and the ways to name a model, without a browser: every record is
// complete and its shape is one the engine knows (the wasm's shapeInfo), with weights
// that match its files' sizes; ids, Hugging Face files and split GGUF parts resolve to
// the URLs the worker fetches; bad names are BadRequest before any worker starts.
// Needs pkg/dist (scripts/build-pkg.sh).
//   node --test tests/node/
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const wasm = await import(join(ROOT, 'pkg', 'dist', 'dflash_web.js'));
wasm.initSync({ module: readFileSync(join(ROOT, 'pkg', 'dist', 'dflash_web_bg.wasm')) });
const api = await import(join(ROOT, 'pkg', 'index.js'));
const { CATALOG, catalogEntry, huggingFaceUrl, splitParts, createEngine, planModel, hasCached } = api;

const HEX64 = /^[0-9a-f]{64}$/;

test('every catalogue record is complete, with a shape the engine knows that fits its files', () => {
  const ids = new Set();
  for (const m of CATALOG) {
    assert.ok(/^[a-z0-9][a-z0-9._-]*$/.test(m.id), m.id);
    assert.ok(!ids.has(m.id), `${m.id} twice`);
    ids.add(m.id);
    assert.equal(catalogEntry(m.id), m);
    assert.ok(m.name && Array.isArray(m.requires), m.id);
    assert.ok(m.files.length >= 1, m.id);
    for (const f of m.files) {
      assert.ok(/^[\w.-]+\/[\w.-]+$/.test(f.repo) && f.file.endsWith('.gguf'), `${m.id}: ${f.repo} ${f.file}`);
      assert.ok(Number.isSafeInteger(f.size) && f.size > 0, `${m.id}: size`);
      assert.match(f.sha256, HEX64, `${m.id}: sha256`);
    }
    // A split model lists every part, in order, as gguf-split names them.
    const urls = m.files.map((f) => huggingFaceUrl(f));
    assert.deepEqual(splitParts(urls[0]), urls, `${m.id}: parts`);
    // The shape is the engine's, and its weights (as a Q4_K_M GGUF repacks them) are
    // within 40% of the files' bytes: the record names the model it sizes.
    const shape = wasm.shapeInfo(m.shape);
    const bytes = m.files.reduce((a, f) => a + f.size, 0);
    const ratio = bytes / shape.weight_bytes;
    assert.ok(ratio > 0.6 && ratio < 1.4, `${m.id}: files ${bytes} B, shape ${m.shape} ${shape.weight_bytes} B`);
  }
  assert.ok(CATALOG.some((m) => m.files.length > 1), 'a split model is in the catalogue');
  assert.ok(CATALOG.filter((m) => m.drafter).length >= 4, 'the pairs with drafters');
});

test('the SmolLM2 drafter the catalogue ships is the committed one, pinned', () => {
  const d = catalogEntry('smollm2-135m-instruct-q4_1').drafter;
  const files = [['config', 'config.json'], ['weights', 'model.safetensors'], ['draftVocab', 'draft_vocab.json']];
  for (const [k, file] of files) {
    const committed = readFileSync(join(ROOT, 'drafters', 'smollm2-135m-instruct-dflash-b16', file));
    assert.equal(d[k].size, committed.length, file);
    assert.equal(d[k].sha256, wasm.sha256Hex(committed), file);
    assert.ok(d[k].url.endsWith(`/pkg/drafters/smollm2-135m-instruct-dflash-b16/${file}`), d[k].url);
  }
  // The memory plan counts the draft vocabulary's rows of the head: as many as it lists.
  const vocab = JSON.parse(readFileSync(join(ROOT, 'drafters', 'smollm2-135m-instruct-dflash-b16', 'draft_vocab.json')));
  assert.equal(d.draftVocab.ids, vocab.token_ids.length);
});

test('Hugging Face files and split GGUF names resolve to every part', () => {
  assert.equal(huggingFaceUrl({ repo: 'Qwen/Qwen3-8B-GGUF', file: 'Qwen3-8B-Q4_K_M.gguf' }),
    'https://huggingface.co/Qwen/Qwen3-8B-GGUF/resolve/main/Qwen3-8B-Q4_K_M.gguf');
  assert.equal(huggingFaceUrl({ repo: 'a/b', file: 'dir/x y.gguf', revision: 'v1.0' }),
    'https://huggingface.co/a/b/resolve/v1.0/dir/x%20y.gguf');
  assert.deepEqual(splitParts('https://h/m-00002-of-00003.gguf?download=1'), [1, 2, 3].map((i) => `https://h/m-0000${i}-of-00003.gguf?download=1`));
  assert.deepEqual(splitParts('https://h/m.gguf'), ['https://h/m.gguf']);
  assert.deepEqual(splitParts('https://h/m-00004-of-00003.gguf'), ['https://h/m-00004-of-00003.gguf']);
  for (const bad of [{ repo: 'no-slash', file: 'x.gguf' }, { repo: 'a/b', file: '../x.gguf' }, { repo: 'a/b', file: 'x', revision: 'a b' }]) {
    assert.throws(() => huggingFaceUrl(bad), (e) => e.code === 'BadRequest', JSON.stringify(bad));
  }
});

test('an unknown catalogue id and malformed model names are BadRequest before any worker starts', async () => {
  // No Worker exists in node: a check that came after starting one would fail otherwise.
  const code = async (p) => p.then(() => 'ok', (e) => e.code);
  assert.equal(await code(createEngine({ model: 'qwen3-9b-q4' })), 'BadRequest');
  assert.equal(await code(createEngine({ model: { repo: 'nope', file: 'x.gguf' } })), 'BadRequest');
  assert.equal(await code(createEngine({ model: { parts: [] } })), 'BadRequest');
  assert.equal(await code(createEngine({ model: { url: 'x.gguf', sha256: 'abc' } })), 'BadRequest');
  assert.equal(await code(createEngine({ model: 'smollm2-135m-instruct-q4_1', memoryBudget: -1 })), 'BadRequest');
  // A draft vocabulary's declared size is a positive integer below 2^32.
  for (const ids of [0, -1, 2 ** 32, 1.5, '8192']) {
    const drafter = { config: 'c.json', weights: 'w.safetensors', draftVocab: { url: 'v.json', ids } };
    assert.equal(await code(createEngine({ model: 'smollm2-135m-instruct-q4_1', drafter })), 'BadRequest', String(ids));
  }
  assert.equal(await code(planModel('qwen3-9b-q4')), 'BadRequest');
  assert.equal(await code(planModel('qwen3-8b-q4_k_m', { context: 0 })), 'BadRequest');
  // An engine's worker answers its own calls: a plan takes a worker function.
  assert.equal(await code(planModel('qwen3-8b-q4_k_m', { worker: { postMessage() {} } })), 'BadRequest');
  // Without Cache Storage nothing is cached.
  assert.equal(await hasCached('qwen3-8b-q4_k_m'), false);
});
