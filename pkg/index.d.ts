// Types of the dflash-web API (index.js).

export type DFlashErrorCode =
  | 'NoWebGPU'          // no navigator.gpu, or no adapter / device
  | 'OutOfMemory'       // GPU memory ran out while the model loaded, or it exceeds the memory budget
  | 'LimitsExceeded'    // a buffer exceeds the adapter's limits (binding size, ...), found from the header
  | 'BadModelFile'      // not a GGUF, truncated, corrupt, unsupported tensor types or architecture
  | 'DrafterMismatch'   // the drafter does not fit the model (hidden size, vocab, layers, ...)
  | 'DeviceLost'        // the GPU device was lost; create a new engine
  | 'ContextOverflow'   // the prompt fills the context (max_tokens is cut to the room left, finish_reason 'length')
  | 'BadRequest'        // invalid messages or sampling parameters
  | 'Unsupported'       // a valid request this engine cannot run (penalties on the GPU sampler)
  | 'NetworkError'      // a weight file could not be fetched, or its download failed or ended short (nothing is cached)
  | 'IntegrityError'    // the file's sha256 differs from the one given
  | 'CacheCorrupt'      // a cached copy could not be read (it is dropped and fetched again first)
  | 'Busy'              // with ifBusy: 'reject', a request made while another is unanswered
  | 'Aborted'           // the request's AbortSignal fired (create(req, { signal }))
  | 'Panic'             // the engine panicked (a bug); the message is the panic's. The worker is replaced and the model reloaded
  | 'Unloaded'
  | 'GpuError'
  | 'WorkerError'
  | 'Error';

export declare class DFlashError extends Error {
  readonly name: 'DFlashError';
  readonly code: DFlashErrorCode;
}

/** A URL (plain, or a Hugging Face `resolve` URL) or a File picked by the user. */
export type FileSource = string | URL | Blob;

export interface Progress {
  phase: 'download' | 'cache' | 'build';
  file: 'model' | 'drafter config' | 'drafter weights' | 'drafter vocab';
  /** The file's bytes so far, of `total`. */
  loaded: number;
  total: number;
  /** For the model: which part of a split GGUF (1-based), of `parts`. */
  part?: number;
  parts?: number;
  /** Bytes over every file of the load (a file counts from the catalogue's size, else
   *  once it opens). */
  overall: { loaded: number; total: number };
  /** A line for people: which file, MB of MB, the speed, and the whole. */
  text: string;
}

/** One file on the Hugging Face hub: `https://huggingface.co/{repo}/resolve/{revision}/{file}`. */
export interface HuggingFaceFile {
  repo: string;
  file: string;
  /** Default 'main'. */
  revision?: string;
  sha256?: string;
  size?: number;
}

/** One file of a model or drafter: a URL, a File, or a pinned or Hugging Face file. */
export type ModelFile = FileSource | { url?: string | URL; file?: Blob; sha256?: string; size?: number } | HuggingFaceFile;

/** A model + drafter pair of the catalogue (`CATALOG`), loaded by its id. */
export interface CatalogEntry {
  id: string;
  name: string;
  /** The model's shape (the engine's named shapes), by which `planModel` sizes it. */
  shape: string;
  /** The GGUF file, or every part of a split one, in order. */
  files: (HuggingFaceFile & { size: number; sha256: string })[];
  /** Its DFlash drafter, or null. */
  drafter: null | { repo: string; revision?: string } | { config: ModelFile; weights: ModelFile; draftVocab?: FileSource | { url?: string | URL; file?: Blob; sha256?: string; size?: number; ids?: number } | (HuggingFaceFile & { ids?: number }) };
  /** WebGPU features needed beyond the defaults. */
  requires: string[];
}

/** What a catalogue model needs here (planModel), in bytes; the GPU figures are null on the CPU engine. */
export interface ModelPlan {
  engine: 'gpu' | 'cpu' | 'auto';
  /** The files' bytes, where the catalogue knows every size. */
  download: number | null;
  weights: number | null;
  kv_cache: number | null;
  activations: number | null;
  total: number | null;
}

export interface EngineOptions {
  /**
   * A catalogue id (`CATALOG`, e.g. 'qwen3-8b-q4_k_m': its files, hashes and drafter; the
   * adapter is checked against the model's memory plan before anything downloads), a
   * GGUF URL (naming one part of a split GGUF, NAME-00001-of-00003.gguf, loads every
   * part), a File, a pinned `{ url, sha256 }`, a Hugging Face `{ repo, file, revision }`,
   * or `{ parts: [...] }` listing a split model's files in order.
   */
  model: string | ModelFile | { parts: ModelFile[] };
  /** A DFlash drafter: a folder URL holding config.json and model.safetensors, the folder
   *  with pinned sha256s (hex) of its files (and of its draft_vocab.json, which is then
   *  read too), or the files, each optionally pinned. Every
   *  file's sha256 is stored with its cached copy and checked on each load, as the model's:
   *  a pinned hash that differs is 'IntegrityError', a cached copy that changed is fetched
   *  again. */
  drafter?:
    | null
    | false
    | string
    | URL
    | { url: string | URL; sha256?: { config?: string; weights?: string; draftVocab?: string } }
    | { repo: string; revision?: string; sha256?: { config?: string; weights?: string; draftVocab?: string } }
    | {
        config: FileSource | { url?: string | URL; file?: Blob; sha256?: string };
        weights: FileSource | { url?: string | URL; file?: Blob; sha256?: string };
        /** Its draft_vocab.json: greedy drafts among these ids of the lm_head (faster
         *  drafts, still lossless); `ids`, how many it lists, puts their rows of the head
         *  in the memory plan. */
        draftVocab?: FileSource | { url?: string | URL; file?: Blob; sha256?: string; ids?: number };
      };
  /** KV cache capacity in tokens (default 2048). */
  context?: number;
  /** Bytes the model may take on the GPU: a catalogue model whose plan needs more fails
   *  with 'OutOfMemory' before it downloads. */
  memoryBudget?: number;
  /**
   * Which engine runs the model: 'gpu' (WebGPU; NoWebGPU without it), 'cpu' (the
   * quantized wasm SIMD engine) or 'auto' (default: WebGPU unless the browser has none
   * or only a software fallback adapter such as SwiftShader, where the CPU engine is
   * faster).
   */
  engine?: 'auto' | 'gpu' | 'cpu';
  /**
   * Threads of the CPU engine (1-64; default: navigator.hardwareConcurrency, at most 8).
   * More than one needs a cross-origin isolated page (COOP `same-origin` and COEP
   * `require-corp` or `credentialless`, so that SharedArrayBuffer exists); elsewhere the
   * engine runs on one thread. `info.cpu.threads` says how many run.
   */
  threads?: number;
  onProgress?: (p: Progress) => void;
  /**
   * A worker running worker.js, when the bundler cannot resolve `new URL('./worker.js',
   * import.meta.url)`. Prefer a function returning a new one: after a panic the engine
   * replaces its worker; with a Worker instance it cannot, and fails what was waiting.
   */
  worker?: Worker | (() => Worker);
  /**
   * A chat request made while another is unanswered: 'queue' (default) runs it after the
   * ones before it; 'reject' fails it at once with code 'Busy'.
   */
  ifBusy?: 'queue' | 'reject';
}

/** 'developer' is taken as 'system'; content may be OpenAI's text parts (joined);
 *  `name` is accepted and ignored. An assistant's `tool_calls` (content may then be
 *  null) and a tool's answer (`role: 'tool'`, `tool_call_id`) go back through the
 *  model's chat template. */
export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | 'developer' | 'tool';
  content: string | { type: 'text'; text: string }[] | null;
  name?: string;
  tool_calls?: ToolCall[];
  tool_call_id?: string;
}

/** A function the model may call: its parameters a JSON schema (an object schema). */
export interface Tool {
  type: 'function';
  function: { name: string; description?: string; parameters?: object; strict?: boolean };
}

/** A call the model made: `arguments` is a JSON string, valid against the tool's
 *  parameters. */
export interface ToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

/** One generated token's log-probability (log-softmax after penalties and the grammar's
 *  mask, before temperature), its bytes and its most likely alternatives. */
export interface TokenLogprob {
  token: string;
  logprob: number;
  bytes: number[];
  top_logprobs: { token: string; logprob: number; bytes: number[] }[];
}

/** `response_format`: text, any JSON object (WebLLM's optional `schema`, an object or a
 *  string, is taken too), or JSON valid against a schema (strict: schema keywords the
 *  grammar engine lacks are an error; not strict: ignored). */
export type ResponseFormat =
  | { type: 'text' }
  | { type: 'json_object'; schema?: object | string }
  | { type: 'json_schema'; json_schema: { name?: string; description?: string; schema?: object | boolean; strict?: boolean | null } };

/** The grammar extension: a Lark grammar (llguidance's dialect) or a regular expression
 *  the whole answer matches. */
export type Grammar = { type: 'lark'; grammar: string } | { type: 'regex'; pattern: string };

/** An explicit null in any optional field means its default (as OpenAI's clients send
 *  them); NaN or Infinity in a number is BadRequest. A field not declared here is
 *  ignored and named in the answer's `ignored_fields`. */
export interface ChatCompletionRequest {
  messages: ChatMessage[];
  model?: string;
  stream?: boolean;
  max_tokens?: number;
  max_completion_tokens?: number;
  /** Default 1 (as OpenAI); 0 is greedy. */
  temperature?: number;
  top_p?: number;
  top_k?: number;
  min_p?: number;
  /** OpenAI's penalties, in [-2, 2] (CPU engine; the GPU sampler refuses them with
   *  `Unsupported`): a token's logit minus frequency_penalty times its count in the
   *  completion so far, and minus presence_penalty if it occurs there (as OpenAI). */
  frequency_penalty?: number;
  presence_penalty?: number;
  /** CTRL's repetition penalty (> 0, 1 disables; CPU engine). */
  repetition_penalty?: number;
  seed?: number;
  stop?: string | string[];
  /** include_usage: one more chunk after the finish chunk, with `choices: []` and the
   *  usage, as OpenAI sends (the finish chunk carries the usage either way). */
  stream_options?: { include_usage?: boolean };
  /** Each generated token's log-probability (choices[].logprobs.content), with
   *  `top_logprobs` (0-20) alternatives; the same with DFlash as without. */
  logprobs?: boolean | null;
  top_logprobs?: number | null;
  /** Functions the model may call, in its own format (its chat template renders them:
   *  Hermes `<tool_call>` or Llama 3.1 JSON), each call's arguments constrained to its
   *  tool's parameters (as response_format). A template that renders no tool calls is
   *  BadRequest. */
  tools?: Tool[] | null;
  /** 'auto' (default: text, or calls once the model opens one), 'none', 'required', or
   *  a named function. */
  tool_choice?: 'none' | 'auto' | 'required' | { type: 'function'; function: { name: string } } | null;
  /** Whether one answer may hold several calls (default true). */
  parallel_tool_calls?: boolean | null;
  // OpenAI fields accepted at the values that change nothing (anything else is
  // BadRequest naming the field): code written for OpenAI's client or WebLLM runs as is.
  n?: 1;
  logit_bias?: Record<string, never> | null;
  /** Constrains the answer: the same tokens as constrained plain decoding, with DFlash
   *  too, on the GPU and CPU engines. A schema that does not compile is BadRequest; an
   *  answer the token budget cuts ends with finish_reason 'length'. */
  response_format?: ResponseFormat | null;
  /** Our extension: constrain the answer to a Lark grammar or a regex (as
   *  response_format; not both). */
  grammar?: Grammar | null;
  functions?: [] | null;
  function_call?: 'none' | 'auto' | null;
  // Accepted and ignored.
  user?: string;
  metadata?: Record<string, string>;
  store?: boolean;
  service_tier?: string;
  modalities?: string[];
  /** DFlash speculative decoding (default: on when a drafter is loaded). Lossless. */
  dflash?: boolean;
  /** Block size of DFlash: rows verified per step, or 'auto' (default). */
  block?: number | 'auto';
  /** At temperature > 0: verify drafts by rejection sampling (the model's distribution,
   *  more drafts accepted) instead of matching the plain sampler's tokens. Default false. */
  rejection_sampling?: boolean;
  /** With rejection_sampling: a DFlash drafter's drafts drawn from its own distribution
   *  (its top 16 at the temperature, as z-lab's reference does) instead of its argmax.
   *  DFlash2 drafters always draw. Default false. */
  sampled_drafts?: boolean;
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prefill_s: number;
  decode_s: number;
  prefill_tok_s: number;
  decode_tok_s: number;
  /** Seconds from the start of this request's prefill to its first token. */
  time_to_first_token_s: number;
  /** Leading prompt tokens whose KV rows were kept from the previous request (multi-turn
   *  reuse: the prompt's longest common prefix with what the cache holds), not prefilled. */
  prompt_tokens_details: { cached_tokens: number };
  dflash:
    | { enabled: false }
    | { enabled: true; block: string; steps: number; mean_tau: number; accepted_tokens: number; acceptance_by_position: number[] };
}

/** 'abort': the request was interrupted (`engine.interrupt()`); 'tool_calls': the
 *  answer ended with calls. */
export type FinishReason = 'stop' | 'length' | 'abort' | 'tool_calls';

export interface ChatCompletion {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  choices: {
    index: number;
    message: { role: 'assistant'; content: string | null; tool_calls?: ToolCall[] };
    finish_reason: FinishReason;
    logprobs?: { content: TokenLogprob[] } | null;
  }[];
  usage: Usage;
  /** The request's fields this API does not have, ignored (absent when none). */
  ignored_fields?: string[];
  /** What a not-strict JSON schema left unenforced (keywords the grammar engine lacks):
   *  the answer is not held to them (absent when none). */
  grammar_warnings?: string[];
}

export interface ChatCompletionChunk {
  id: string;
  object: 'chat.completion.chunk';
  created: number;
  model: string;
  choices: {
    index: number;
    delta: { role?: 'assistant'; content?: string; tool_calls?: (ToolCall & { index: number })[] };
    finish_reason: FinishReason | null;
    logprobs?: { content: TokenLogprob[] };
  }[];
  /**
   * On content chunks: the piece's token ids (the tokens committed since the previous
   * piece) and whether its last token was an accepted draft.
   */
  dflash?: { drafted: boolean; token_ids: number[] };
  /** On the last chunk. */
  usage?: Usage;
  /** On the first chunk: the request's fields this API does not have, ignored. */
  ignored_fields?: string[];
  /** On the finish chunk: what a not-strict JSON schema left unenforced. */
  grammar_warnings?: string[];
}

export interface EngineInfo {
  /** The engine that runs the model. */
  engine: 'gpu' | 'cpu';
  /** On the CPU engine: its dot-product kernel ('simd128' or 'scalar') and the threads it runs on. */
  cpu?: { kernel: string; threads: number };
  /** The WebGPU adapter (null on the CPU engine). */
  adapter: null | { name: string; backend: string; device_type: string; driver: string; shader_f16: boolean; kv_cache_f16: boolean; max_storage_buffer_binding_size: number; max_buffer_size: number };
  context: number;
  drafter: { block_size: number; layers: number; target_layer_ids: number[] } | null;
  /** The model file's sha256 (a split model's first part; every part's in part_sha256). */
  sha256: string;
  parts: number;
  part_sha256: string[];
  load_s: number;
  from_cache: boolean;
}

export interface Engine {
  readonly info: EngineInfo;
  chat: {
    completions: {
      /** `options.signal` aborts the request (code 'Aborted'); the worker stops it within one step. */
      create(request: ChatCompletionRequest & { stream: true }, options?: { signal?: AbortSignal }): AsyncIterable<ChatCompletionChunk>;
      create(request: ChatCompletionRequest & { stream?: false }, options?: { signal?: AbortSignal }): Promise<ChatCompletion>;
    };
  };
  /** Chat requests not yet answered: the running one and those queued behind it. */
  readonly pending: number;
  /** Times the worker was replaced after a panic (the model reloaded from the cache). */
  readonly restarts: number;
  /** Ends the running request before its next token (finish_reason 'abort'); the engine stays usable. */
  interrupt(): void;
  /** Forgets the conversation held in the KV cache, after the requests already made: the
   *  next request prefills its whole prompt. Without it, each request keeps the rows of
   *  its prompt's longest common prefix with the last one (the same tokens either way). */
  resetChat(): Promise<void>;
  unload(): Promise<void>;
  /** TEST ONLY, and only in a package built with `DFLASH_TEST_HOOKS=1` (elsewhere it
   *  rejects with 'BadRequest'): panics inside the engine: rejects with code 'Panic' and
   *  `message`, and the worker is replaced. */
  __testTrap(message: string): Promise<never>;
  /** TEST ONLY (`DFLASH_TEST_HOOKS=1`, else 'BadRequest'): panics on a thread of the CPU
   *  engine's pool while the worker waits for it: rejects with code 'Panic' and
   *  `message`, and the worker is replaced. */
  __testPoolPanic(message: string): Promise<never>;
  /** TEST ONLY, and only with `DFLASH_TEST_HOOKS=1` (else 'BadRequest'): destroys the
   *  GPU device (GPUDevice.destroy()): later requests fail with 'DeviceLost'. */
  __testLoseDevice(): Promise<void>;
}

export declare function hasWebGPU(): boolean;
export declare function createEngine(options: EngineOptions): Promise<Engine>;
/** The catalogue of model + drafter pairs. */
export declare const CATALOG: CatalogEntry[];
export declare function catalogEntry(id: string): CatalogEntry | undefined;
/** What a catalogue model needs on this browser, from the engine's memory plan; rejects with
 *  'LimitsExceeded' (naming the limit) or 'OutOfMemory' (past memoryBudget). Downloads nothing. */
export declare function planModel(
  id: string,
  options?: { context?: number; dflash?: boolean; engine?: 'auto' | 'gpu' | 'cpu'; memoryBudget?: number; worker?: () => Worker },
): Promise<ModelPlan>;
/** A synthetic pair to bench on the wasm CPU engine (`benchSynthetic`). */
export interface SyntheticBenchOptions {
  /** A named shape: 'qwen3-4b', 'qwen3-8b', 'llama-3.1-8b', 'smollm2-135m', ... */
  shape: string;
  /** Only the first layers (each of its real size), to fit the memory budget. */
  layers?: number;
  /** Per draft slot, the probability that it is right given the slots before were. */
  acceptProfile: number[];
  /** Block policies: rows ('8') or 'auto'. */
  blocks: string[];
  prompts?: number;
  promptTokens?: number;
  maxNewTokens?: number;
  seed?: number;
  /** Bytes the weights may take (at most 3.5 GiB). */
  memoryBudget?: number;
}
/** What `benchSynthetic` measured. */
export interface SyntheticBenchReport {
  shape: string;
  layers: number;
  weight_bytes: number;
  drafter_weight_bytes: number;
  cpu: { kernel: string; threads: number };
  wasm_threads: number;
  plain_tok_s: number;
  runs: { block: string; dflash_tok_s: number; speedup: number; mean_tau: number; steps: number; lossless: boolean; step_costs: number[] | null }[];
  [field: string]: unknown;
}
/** The wasm CPU engine's DFlash speed on a synthetic pair, in a worker of its own; rejects
 *  with 'OutOfMemory' before allocating past memoryBudget, 'BadRequest' for a bad option. */
export declare function benchSynthetic(
  options: SyntheticBenchOptions,
  settings?: { threads?: number; worker?: () => Worker },
): Promise<SyntheticBenchReport>;
/** Whether every file of a catalogue model (by id) or of a model URL is in the weight cache. */
export declare function hasCached(idOrUrl: string): Promise<boolean>;
/** `https://huggingface.co/{repo}/resolve/{revision}/{file}`. */
export declare function huggingFaceUrl(f: { repo: string; file?: string; revision?: string }): string;
/** Every part's URL of a split GGUF named by one of its parts; else [url]. */
export declare function splitParts(url: string): string[];
/** The files in the weight cache, each with the catalogue model it belongs to (or null). */
export declare function cachedFiles(): Promise<{ url: string; size: number; sha256: string; model: string | null }[]>;
export declare function clearCache(url?: string): Promise<void>;
