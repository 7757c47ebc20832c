//! dflash-gpu: the WebGPU engine shared by the browser and the native benchmark.
//! The same Rust and the same WGSL (`shaders/`) on every Vulkan / Metal / DX12 device,
//! on lavapipe in CI and on the browser's WebGPU.
//!
//! The public surface:
//! - [`GpuContext`] (adapter, device, limits; [`GpuOptions`]) and [`GpuModel`] (a target's
//!   weights uploaded as [`GpuWeights`], its KV cache and recorded plans;
//!   [`GpuModelOptions`], [`MemoryPlan`]); [`StreamLoader`] uploads a GGUF as it arrives.
//! - [`generate`]: plain decoding; [`speculative::Speculative`]: DFlash / DFlash2 (the
//!   drafter, the step, its plan cache and step costs); both driven by dflash-core's
//!   shared loop (`BlockLoop`, `TokenSink`).
//! - [`ops`] and [`pipelines`]: the kernels and their typed parameter structs, for tests
//!   and the profiler ([`profile`], native only); [`synthetic`]: random weights of a
//!   named shape for `dflash bench --synthetic`.
//! - Errors: [`GpuError`] and [`Result`].
//!
//! The `testutil` feature adds the tests' hooks (host drafts, read-backs of the last
//! block); neither the CLI nor the wasm package enables it.
//!
//! # Where the details are
//!
//! Plans, steps, pipelining, the fused decode plan, the kernels and device set-up are
//! below. Code: this crate's `src/` (kernels one file per family in `ops/`), WGSL in
//! `shaders/`. DFlash's step: `speculative`'s module docs
//! (`crates/dflash-gpu/src/speculative/mod.rs`); the streamed loader: `stream_load`
//! (`crates/dflash-gpu/src/stream_load.rs`); the per-adapter tuning table: `tuning`
//! (`crates/dflash-gpu/src/tuning.rs`); MoE layers: `ops::moe`
//! (`crates/dflash-gpu/src/ops/moe.rs`); hybrid layers and verification over recurrent
//! state: `dflash_core::cpu::delta_net` (`crates/dflash-core/src/cpu/delta_net.rs`).
//!
//! # Plans and steps
//!
//! Every op has the same shape (`ops.rs`, which re-exports one file per kernel family
//! under `ops/`): a `Kernel` (`kernel.rs`: shader file, entry point, override constants)
//! whose key names its pipeline in the context's cache (`pipelines.rs`), a small uniform
//! of parameters, its bindings, and a workgroup count. A model records, once per (row
//! count, head), the list of dispatches of a whole forward pass with their bind groups; a
//! step writes the token ids and the position (`state`) with `queue.write_buffer`,
//! encodes the list in one compute pass, submits once, and maps back 4 bytes per row.
//! Nothing is allocated per step.
//!
//! # Pipelining
//!
//! Plain generation on GPUs (`Tuning::pipelined_decode`; on lavapipe it measured 5%
//! slower, so CPU adapters read each token first) keeps one step in flight
//! (`GpuModel::decode_async`, which `generate` and `dflash bench` both decode through):
//! each step copies its token into the next step's input on the GPU and into one of two
//! read-back buffers, so the host asks for step k's token (`GpuContext::begin_map`: in
//! the browser a map completes with the work submitted before it was requested), then
//! submits step k+1, then waits for the token (natively for submission k only); a step
//! queued behind a stop is dropped (its row never committed), and none is queued past the
//! budget or the context.
//!
//! DFlash steps are pipelined the same way (`Speculative::decode_steps_async`, the loop
//! of `generate` and `dflash bench`): the GPU keeps the position, the anchor and the
//! drafter's context itself (`state`, `ext_state`, the accept kernel), so step k+1 is
//! submitted before step k's (accepted, tokens) is read, into the other of two read-back
//! buffers, whenever its block cannot depend on step k's outcome (even if step k kept all
//! its rows, the context and the budget leave room for the policy's largest block), so
//! fixed blocks are those of one step at a time; a step queued behind a stop is dropped,
//! and a hybrid model's recurrent states, which it ran past, count as lost (the next
//! prompt is prefilled whole). A one-row step after a one-row step defers the drafter's
//! context extension (`Speculative::defers`): it drafts nothing, its taps land after the
//! rows still waiting (`GpuModel::build_plan_tapping_at`) and its commit leaves
//! `ext_state` (`keep_context`), and the next step that drafts, or the one-row step that
//! would overflow the 16 rows of taps, extends every waiting row at once; so auto mode's
//! idle steps cost what plain steps do (lavapipe: block 1 0.96-1.03x -> 0.99-1.00x plain,
//! run.sh's auto 0.951x -> 0.988x), and the drafted block has the bits of an engine that
//! prefilled every committed row (`crates/dflash-gpu/tests/dflash.rs`). The bench's
//! simulated acceptance writes each step's drafts after the step before is read, so it
//! runs one step at a time; `dflash bench --pipelined true|false` overrides the tuning.
//!
//! The read back is an `async fn` (`GpuContext::read_mapped_async`: the map callback
//! fills a slot that a future waits on), and so are `step_with_async`,
//! `prefill_with_async` and the DFlash loop
//! (`Speculative::{prefill,step,generate}_async`): in the browser the callback comes from
//! the event loop; natively `step_with`, `prefill`, `generate` wrap them in
//! `pollster::block_on` after a blocking poll. One code path serves both hosts.
//!
//! # The fused decode plan
//!
//! A decode step of the target is 6 dispatches per layer and 3 more (embedding, lm_head,
//! greedy reduction) on a GPU: `model::build_plan` = `blocks::attention_block` (QKV GEMV
//! with RMSNorm in its prologue and the bias in its epilogue; chunked attention, whose
//! first dispatch also does the per-head q/k norms, RoPE and the K/V store and whose
//! second merges the chunks; o_proj + residual) and `blocks::mlp_block` (gate/up stacked
//! as one matrix, RMSNorm in the prologue and SwiGLU in the epilogue; down + residual)
//! per layer, then `head` (final RMSNorm in the lm_head's prologue; the greedy head's
//! first half in its epilogue, `argmax.wgsl reduce` the second). q/k/v and gate/up are
//! stacked at load by GPU copies (`upload::concat_rows`) where they share a format; where
//! they do not (a GGUF that mixes quant types), the same plan runs them as separate
//! GEMVs, each with the norm fused. Every fusion evaluates the same expressions in the
//! same order as the separate kernels, so the bits are those of the unfused plan
//! (`crates/dflash-gpu/tests/fused.rs`).
//!
//! lavapipe runs 6 per layer and 4 more (184): `qkv.wgsl` then `attention.wgsl`, and each
//! RMSNorm after a residual GEMV split between that GEMV and the GEMVs that read the norm
//! (`Tuning::norm_in_residual`: the residual GEMV's epilogue writes x * the norm's weight
//! and each row-owning thread's sum of x^2 over its rows, `main_norm_out`; the readers
//! sum those partials, as vec4 in order, for 1/rms and multiply their finished sums by
//! it, `NORM_SUMS`; no barrier, no workgroup walking x; with more than one lane per row
//! the workgroup shares that sum in the prologue), the first layer's norm apart. That
//! split is not the separate kernels' bits (1/rms multiplies the sums, not each x): it is
//! held to the separate norm within rounding, to batch invariance and to the CPU
//! reference (`crates/dflash-gpu/tests/fused.rs`
//! `the_norm_split_into_the_residual_gemv_matches_the_separate_norm`,
//! `crates/dflash-gpu/tests/engine.rs`). SwiftShader keeps the norms apart: 8 per layer
//! and 4 more. The drafter's block pass is built by the same two functions (`blocks.rs`
//! takes a layer's weights, sizes and activations as views, and DFlash2's convolutions
//! around a sublayer as an option), so a change to the layer is made once.
//!
//! # Kernel choices
//!
//! - GEMV (`gemv.wgsl`): `LANES` threads share an output row and take its 32-weight
//!   groups in a fixed stride; partial sums meet in a fixed tree; `N_ROWS` (1..16) rows
//!   are accumulated per weight read. Each thread owns `OUTS` (1, 2, 4 or 8) output rows
//!   and loads every activation once for all of them, so a 16-row verify pass requests
//!   activations `OUTS` times less often; the weights of all owned rows are loaded at the
//!   start of each group. These are override constants: `N_ROWS` and `OUTS` let the loops
//!   unroll, `LANES` and `OUTS` are per-adapter, per-shape knobs (16 lanes on GPUs, 1 on
//!   CPU adapters such as lavapipe and SwiftShader, where barriers are dear: 7x faster
//!   decode there; 4 rows per thread on both, which halved lavapipe's 16-row GEMVs, and 8
//!   on CPU adapters, 10-25% less again at 1, 2 and 16 rows). `THREADS` (threads per
//!   workgroup, per shape too) is 64 but for CPU adapters' matrices of at most 640 rows:
//!   32, so that 8 rows per thread still make three workgroups for two cores (576 x 1536:
//!   310 / 469 / 2856 us at 1 / 2 / 16 rows with 4 rows per thread, 250 / 364 / 2203 with
//!   8). SwiftShader has its own entry (`Tuning::swiftshader`): its JIT keeps the
//!   kernel's private arrays in memory, so every matrix takes 2 rows, or one gate/up
//!   pair, per thread through `accumulate_one_row` (the same sums in function variables,
//!   the second row sharing the x loads: the same bits), in 16-thread workgroups: it runs
//!   a workgroup on one core, and SmolLM2's 576- and 960-row matrices then split evenly
//!   over two (decode 1.68 -> 2.15 tok/s there; 1.11x the engine of 7faf4a8 side by
//!   side). Eight weights at a time, a row's sum gains `scale * sum(q * x) + min *
//!   sum(x)`: the products stay `vec4` until their sum, and the dequantization's
//!   multiply-add is paid once per eight weights rather than per weight (lavapipe at 1
//!   row: the 3072x576 GEMV -15%, 576x1536 -30%, plain decode of SmolLM2 +8%). A
//!   normalised x (`NORM`) is XORed with a zero the compiler cannot see before it is
//!   summed, so that it is not fused into a multiply-add and the fused GEMV keeps the
//!   separate kernels' bits. A row's sum order depends on `LANES` only, never on `N_ROWS`
//!   or `OUTS`, and tests check the bits (`crates/dflash-gpu/tests/fused.rs`
//!   `owning_several_output_rows_per_thread_gives_the_same_bits`). `NORM`, `BIAS` and
//!   `PAIR` (SwiGLU over `[gate; up]`, both rows from the same x loads) are override
//!   constants; `main_argmax` adds each workgroup's best (value, index) per row (each
//!   thread's best over its owned rows first, so the scratch holds one pair per thread
//!   whatever `OUTS` is), and `main_tap` copies what it stores into the DFlash taps (the
//!   down GEMV of a tapped layer but the last: the copy dispatch it replaces). Every
//!   kernel's uniform is a typed `#[repr(C)]` struct (`ops::GemvParams` in `ops/gemv.rs`,
//!   `ops::QkvParams` in `ops/attention.rs`, ... `speculative::BookkeepingParams`) whose
//!   layout `crates/dflash-gpu/tests/params_layout.rs` checks against the WGSL struct
//!   with naga (and `crates/dflash-gpu/tests/bindings.rs` each named binding index,
//!   `ops::*Binding`, against the shader's `@binding`).
//! - Attention on CPU adapters (`attention.wgsl`): one workgroup per (row, `HEADS` query
//!   heads of one KV head: the group's largest divisor up to 8), keys in chunks of 64 in
//!   position order with an online softmax per head. Each key and value is loaded once,
//!   as a vector of 4, for all the workgroup's heads; each head's chunk max and sum walk
//!   the common fixed tree in one thread, so a chunk costs 5 barriers, not 17 (lavapipe
//!   makes each barrier a coroutine switch and each load a loop over the lanes). Per head
//!   the arithmetic is that of a workgroup per (head, row), so the bits did not change.
//!   On lavapipe (SmolLM2, `dflash bench --profile --profile-block 2`, medians of 3
//!   alternations) it took attention after a 300-token prompt from 32.6 to 15.2 ms per
//!   one-row step and from 59.3 to 22.1 ms per 2-row pass (the pass from 1.48 to 1.32
//!   one-row steps), and after 43 tokens from 8.2 to 4.5 ms.
//! - Attention on GPUs (`attention_chunks.wgsl`, `Tuning::chunked_attention`, where the
//!   device grants the 9 storage buffers per stage it binds): a row's keys split into
//!   chunks fixed by absolute position (`ops::attention_chunking`, `ops/attention.rs`: a
//!   multiple of 64 keys, at most 32 chunks for the cache's capacity); one workgroup per
//!   (KV head, tile of its query heads, tile of the pass's rows, chunk) reads each key
//!   and value once for every (row, query head) of the tiles (up to 16 pairs: a 16-row
//!   verify pass reads the cache about 16 / rows-per-tile times less often than a
//!   workgroup per row), each pair with its own online softmax over sub-chunks aligned to
//!   absolute multiples of 64 keys, a sub-chunk without keys of its row leaving it
//!   exactly as it was; `combine` merges a row's chunks in ascending order. Keys of the
//!   pass itself are read from the QKV rows, normalised and rotated by the function that
//!   stores them and rounded to the cache's precision, so they have the bits a later pass
//!   reads from the cache. Either way a row's result depends on its position only.
//! - RoPE reads a cos/sin table computed on the host with the CPU reference's function.
//! - Prefill runs the same kernels over chunks of 16 rows (no lm_head but for the last
//!   chunk), so a position's logits are the same bits in prefill, in a 16-row pass and
//!   alone.
//! - The sampler (`sample.wgsl`) keeps the tokens at or above a threshold (top-k, min-p,
//!   top-p over an order-preserving integer key of the floats) and walks the kept mass in
//!   token-id order with u = uniform(seed, position): the CPU rule `sampling::sample` is
//!   the same, so the two agree except where differently ordered sums round across u
//!   (about 1 position in 2000 over a 1000-token vocabulary in the tests; over 50,000
//!   tokens without a filter up to 1 in 10, each such position checked to be rounding).
//!   On GPUs (`Tuning::chunked_sampler`) the vocabulary is cut into chunks of 1024 ids
//!   fixed by its size, and the thresholds are found by radix selection, a byte of the
//!   key per round (`histogram`: each chunk's 256 bins of counts or kept mass, each bin
//!   summed in id order by one thread; `select_byte`: the bins over the chunks in
//!   ascending order, the largest byte whose upper set holds k tokens or the top-p goal),
//!   then each chunk's kept mass and `draw`'s walk over chunks, 16-id runs and ids: 20
//!   dispatches of many workgroups per row instead of one workgroup per row bisecting
//!   with ~33 passes over the vocabulary (~3 ms per token on the H200), which CPU
//!   adapters keep. A row's draw depends on its logits, its position and the vocabulary
//!   size only.
//! - f16: where the adapter has shader-f16, the KV cache is stored in f16 (half the
//!   attention traffic); activations and accumulation stay f32.
//!
//! Per-adapter knobs live in one table, `Tuning`: see `tuning`'s module docs
//! (`crates/dflash-gpu/src/tuning.rs`).
//!
//! # Device set-up
//!
//! Device set-up asks for shader-f16 and subgroups where offered and requests the
//! adapter's own limits; `GpuOptions::browser_limits` clamps them to what a browser
//! grants (1 GiB bindings, 256 invocations, 16 KiB workgroup storage), so native CI on
//! SwiftShader finds what the browser would. Errors outside error scopes are recorded
//! (never wgpu's panicking default) and reported by the next call; a lost device answers
//! `DeviceLost`.
//!
//! # Device choice
//!
//! Which engine a native host runs is chosen once, in
//! `crates/dflash-engine/src/device.rs` (`DeviceChoice`): without `--device`, `dflash
//! generate` and `dflash serve` take the GPU engine on a hardware adapter and the
//! quantized CPU engine where the only adapter is a software one (wgpu's
//! `DeviceType::Cpu`: lavapipe, SwiftShader, WARP; it runs the same math on the same CPU,
//! slower) or where there is none, printing a note; `--device gpu` takes the software
//! adapter all the same. The browser worker makes the same choice (`engine: 'auto'`).
//! `dflash bench` keeps `--device gpu` as its default, so `scripts/run.sh` measures
//! lavapipe where there is no GPU.

pub(crate) mod blocks;
pub mod context;
pub mod error;
pub mod generate;
mod int8_scratch;
mod kernel;
pub mod model;
pub mod ops;
pub mod pipelines;
#[cfg(not(target_arch = "wasm32"))]
pub mod profile;
pub mod speculative;
pub mod stream_load;
pub mod synthetic;
mod tuning;
pub mod upload;

pub use context::{GpuContext, GpuOptions};
pub use error::{GpuError, Result};
pub use model::{GpuModel, GpuModelOptions, GpuWeights, MemoryPlan};
pub use stream_load::{StreamLoader, StreamedModel};
