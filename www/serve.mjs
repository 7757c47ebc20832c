// The local dev server of the demo: serves the repository (www/, pkg/, drafters/) and
// the model cache ($DFLASH_CACHE/models, default ~/.cache/dflash/models) under /models/,
// on 127.0.0.1. No dependencies. The pages are cross-origin isolated (COOP same-origin,
// COEP require-corp: SharedArrayBuffer exists, so the CPU engine runs on several
// threads) unless --no-isolation.
//   node www/serve.mjs [--port 8080] [--root DIR] [--no-isolation]   (then open http://127.0.0.1:8080/)
// For tests, the returned `faults` (a Map from a path to { mode, cutAfter, times })
// makes the next `times` answers for that path misbehave: mode 'destroy' announces the
// whole file, sends its first `cutAfter` bytes and destroys the connection (a network
// failure mid-download); 'truncate' announces and sends only `cutAfter` bytes (a
// complete answer holding a short file).
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

/** Answers with the first `cutAfter` bytes of `file`, then fails as `mode` says. */
function misbehave(res, file, size, { mode, cutAfter }, headers) {
  res.writeHead(200, { ...headers, 'content-length': mode === 'truncate' ? cutAfter : size });
  const body = createReadStream(file, { start: 0, end: cutAfter - 1 });
  body.on('data', (c) => res.write(c));
  body.on('end', () => (mode === 'truncate' ? res.end() : res.write('', () => res.socket?.destroy())));
}

/** Starts the server; resolves to { server, port, url, faults }. */
export function serve({ port = 8080, root, models, isolated = true } = {}) {
  const faults = new Map();
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
    const headers = {
      'content-type': TYPES[extname(file)] ?? 'application/octet-stream',
      'cache-control': 'no-cache',
      ...(isolated ? ISOLATION : {}),
    };
    const fault = faults.get(path);
    if (fault?.times > 0 && req.method === 'GET') {
      fault.times--;
      return misbehave(res, file, st.size, fault, headers);
    }
    res.writeHead(200, { ...headers, 'content-length': st.size });
    if (req.method === 'HEAD') return res.end();
    createReadStream(file).pipe(res);
  });
  return new Promise((ok) => server.listen(port, '127.0.0.1', () => {
    const p = server.address().port;
    ok({ server, port: p, url: `http://127.0.0.1:${p}`, faults });
  }));
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const arg = (name, d) => { const i = process.argv.indexOf(name); return i > 0 ? process.argv[i + 1] : d; };
  const { url } = await serve({ port: Number(arg('--port', 8080)), root: arg('--root'), isolated: !process.argv.includes('--no-isolation') });
  console.log(`dflash-web demo: ${url}/www/`);
}
