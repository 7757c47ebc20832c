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
  return { text: r.text, tokens: r.completion_tokens };
}

/** Forwards the page's console and errors to the test log. */
export function watch(page, tag) {
  page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') console.log(`[${tag} ${m.type()}] ${m.text()}`); });
  page.on('pageerror', (e) => console.log(`[${tag} pageerror] ${e.message}`));
}
