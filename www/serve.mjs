// The local dev server of the demo: serves the repository (www/, pkg/, drafters/) and
// the model cache ($DFLASH_CACHE/models, default ~/.cache/dflash/models) under /models/,
// on 127.0.0.1. No dependencies. The pages are cross-origin isolated (COOP same-origin,
// COEP require-corp: SharedArrayBuffer exists, so the CPU engine runs on several
// threads) unless --no-isolation.
//   node www/serve.mjs [--port 8080] [--root DIR] [--no-isolation]   (then open http://127.0.0.1:8080/)
import { createServer } from 'node:http';
import { createReadStream, statSync } from 'node:fs';
import { join, normalize, extname, resolve, dirname } from 'node:path';
import { homedir } from 'node:os';
import { fileURLToPath } from 'node:url';

const TYPES = {
  '.html': 'text/html; charset=utf-8', '.js': 'text/javascript', '.mjs': 'text/javascript', '.css': 'text/css',
  '.json': 'application/json', '.wasm': 'application/wasm', '.png': 'image/png', '.ts': 'text/plain',
};

/** The headers that make a page cross-origin isolated (everything here is same-origin). */
const ISOLATION = { 'cross-origin-opener-policy': 'same-origin', 'cross-origin-embedder-policy': 'require-corp' };

/** Starts the server; resolves to { server, port, url }. */
export function serve({ port = 8080, root, models, isolated = true } = {}) {
  root = resolve(root ?? join(dirname(fileURLToPath(import.meta.url)), '..'));
  models = resolve(models ?? join(process.env.DFLASH_CACHE ?? join(homedir(), '.cache', 'dflash'), 'models'));
  const server = createServer((req, res) => {
    const path = decodeURIComponent(new URL(req.url, 'http://x').pathname);
    if (path === '/') {
      res.writeHead(302, { location: '/www/' });
      return res.end();
    }
    let file = path.startsWith('/models/') ? join(models, normalize(path.slice(8))) : join(root, normalize(path));
    const base = path.startsWith('/models/') ? models : root;
    if (!file.startsWith(base)) {
      res.writeHead(403);
      return res.end();
    }
    let st;
    try {
      st = statSync(file);
      if (st.isDirectory()) {
        file = join(file, 'index.html');
        st = statSync(file);
      }
    } catch {
      res.writeHead(404, { 'content-type': 'text/plain' });
      return res.end(`not found: ${path}`);
    }
    res.writeHead(200, {
      'content-type': TYPES[extname(file)] ?? 'application/octet-stream',
      'content-length': st.size,
      'cache-control': 'no-cache',
      ...(isolated ? ISOLATION : {}),
    });
    if (req.method === 'HEAD') return res.end();
    createReadStream(file).pipe(res);
  });
  return new Promise((ok) => server.listen(port, '127.0.0.1', () => {
    const p = server.address().port;
    ok({ server, port: p, url: `http://127.0.0.1:${p}` });
  }));
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const arg = (name, d) => { const i = process.argv.indexOf(name); return i > 0 ? process.argv[i + 1] : d; };
  const { url } = await serve({ port: Number(arg('--port', 8080)), root: arg('--root'), isolated: !process.argv.includes('--no-isolation') });
  console.log(`dflash-web demo: ${url}/www/`);
}
