// Shared by the browser tests: Debian's chromium driven by playwright-core with the
// flags that give headless WebGPU (SwiftShader), the dev server, and the native
// engine's greedy text to compare against.
import { chromium } from 'playwright-core';
import { execFileSync } from 'node:child_process';
import { join, dirname } from 'node:path';
import { homedir } from 'node:os';
import { fileURLToPath } from 'node:url';
import { existsSync, mkdirSync } from 'node:fs';

export const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const OUT = join(ROOT, 'tests', 'e2e', 'out');
mkdirSync(OUT, { recursive: true });
export const CACHE = process.env.DFLASH_CACHE ?? join(homedir(), '.cache', 'dflash');
export const MODEL_FILE = 'SmolLM2-135M-Instruct.Q4_1.gguf';
export const MODEL = join(CACHE, 'models', MODEL_FILE);
export const DRAFTER = join(ROOT, 'drafters', 'smollm2-135m-instruct-dflash-b16');
export const PROMPT = 'Write a Python function that returns the n-th Fibonacci number.';

for (const f of [MODEL, join(ROOT, 'pkg', 'dist', 'dflash_web_bg.wasm'), join(ROOT, 'target', 'release', 'dflash')]) {
  if (!existsSync(f)) throw new Error(`missing ${f}: run scripts/fetch-models.sh smollm2, scripts/build-pkg.sh and cargo build --release -p dflash-cli`);
}

export function launch({ webgpu = true } = {}) {
  const args = ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'];
  if (webgpu) args.unshift('--enable-unsafe-webgpu');
  return chromium.launch({ executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium', headless: true, args });
}

/** The native engine's greedy answer ({ text, tokens }) (f32 KV cache, as the browser's SwiftShader has no
 *  shader-f16), through the same chat template. */
export function nativeGreedy(prompt, maxTokens, device = 'gpu') {
  const out = execFileSync(join(ROOT, 'target', 'release', 'dflash'), [
    'generate', '--model', MODEL, '--chat', prompt, '--max-new-tokens', String(maxTokens), '--no-f16', '--json',
    '--device', device,
  ], { env: { ...process.env, XDG_RUNTIME_DIR: process.env.XDG_RUNTIME_DIR ?? '/tmp' }, encoding: 'utf8' });
  const r = JSON.parse(out);
  return { text: r.text, tokens: r.completion_tokens, ids: r.tokens };
}

/** Forwards the page's console and errors to the test log. */
export function watch(page, tag) {
  page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') console.log(`[${tag} ${m.type()}] ${m.text()}`); });
  page.on('pageerror', (e) => console.log(`[${tag} pageerror] ${e.message}`));
}

/**
 * A GGUF file split into `count` parts as llama.cpp's gguf-split writes them: the
 * tensors in file order in contiguous runs, the first part with all the metadata, each
 * with split.no (u16), split.count (u16) and split.tensors.count (i32); 32-byte
 * alignment. Returns the parts' bytes (Buffers).
 */
export function splitGguf(file, count) {
  let pos = 24;
  const u32 = () => { const v = file.readUInt32LE(pos); pos += 4; return v; };
  const u64 = () => { const v = Number(file.readBigUInt64LE(pos)); pos += 8; return v; };
  const str = () => { const n = u64(); const s = file.toString('utf8', pos, pos + n); pos += n; return s; };
  const SIZES = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 };
  const skip = (type) => {
    if (type === 8) { str(); return; }
    if (type === 9) { const t = u32(); const n = u64(); for (let i = 0; i < n; i++) skip(t); return; }
    pos += SIZES[type];
  };
  const [nTensors, nKv] = [Number(file.readBigUInt64LE(8)), Number(file.readBigUInt64LE(16))];
  const kvs = [];
  for (let i = 0; i < nKv; i++) {
    const start = pos;
    const key = str();
    skip(u32());
    if (key !== 'general.alignment') kvs.push(file.subarray(start, pos));
  }
  if (kvs.length !== nKv) throw new Error('the test splitter writes 32-byte alignment only');
  const tensors = [];
  for (let i = 0; i < nTensors; i++) {
    const name = str();
    const dims = Array.from({ length: u32() }, u64);
    tensors.push({ name, dims, type: u32(), offset: u64() });
  }
  const dataStart = Math.ceil(pos / 32) * 32;
  tensors.sort((a, b) => a.offset - b.offset);
  tensors.forEach((t, i) => { t.end = i + 1 < tensors.length ? tensors[i + 1].offset : file.length - dataStart; });
  const strBuf = (s) => { const b = Buffer.from(s, 'utf8'); const n = Buffer.alloc(8); n.writeBigUInt64LE(BigInt(b.length)); return Buffer.concat([n, b]); };
  const kv = (key, type, value) => {
    const t = Buffer.alloc(4); t.writeUInt32LE(type);
    const v = Buffer.alloc(type === 2 ? 2 : 4);
    if (type === 2) v.writeUInt16LE(value); else v.writeInt32LE(value);
    return Buffer.concat([strBuf(key), t, v]);
  };
  const per = Math.ceil(tensors.length / count);
  return Array.from({ length: count }, (_, no) => {
    const mine = tensors.slice(no * per, (no + 1) * per);
    const meta = [...(no === 0 ? kvs : []), kv('split.no', 2, no), kv('split.count', 2, count), kv('split.tensors.count', 5, nTensors)];
    const head = Buffer.alloc(24);
    head.write('GGUF', 0, 'latin1');
    head.writeUInt32LE(3, 4);
    head.writeBigUInt64LE(BigInt(mine.length), 8);
    head.writeBigUInt64LE(BigInt(meta.length), 16);
    const infos = [];
    const data = [];
    let off = 0;
    for (const t of mine) {
      const bytes = file.subarray(dataStart + t.offset, dataStart + t.end);
      const info = Buffer.alloc(4 + 8 * t.dims.length + 4 + 8);
      info.writeUInt32LE(t.dims.length, 0);
      t.dims.forEach((d, i) => info.writeBigUInt64LE(BigInt(d), 4 + 8 * i));
      info.writeUInt32LE(t.type, 4 + 8 * t.dims.length);
      info.writeBigUInt64LE(BigInt(off), 8 + 8 * t.dims.length);
      infos.push(strBuf(t.name), info);
      const padded = Math.ceil(bytes.length / 32) * 32;
      data.push(bytes, Buffer.alloc(padded - bytes.length));
      off += padded;
    }
    const header = Buffer.concat([head, ...meta, ...infos]);
    return Buffer.concat([header, Buffer.alloc(Math.ceil(header.length / 32) * 32 - header.length), ...data]);
  });
}
