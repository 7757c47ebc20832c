//! The wasm-bindgen surface the Web Worker drives: a `Loader` that opens WebGPU (or the
//! quantized CPU engine where there is no GPU adapter or only a software one) and takes
//! the model file chunk by chunk (each tensor goes to the GPU, or into the CPU engine's
//! 4/8-bit weights, as it completes; the bytes are hashed as they pass), then an
//! `Engine` that answers chat requests, streaming text pieces through a callback.
//! Everything else is the shared engine.
//!
//! # Faults in the browser
//!
//! A Rust panic in the wasm aborts with a trap (`RuntimeError: unreachable`) that leaves
//! the instance unusable and, inside a running future, settles no promise. The panic hook
//! (`wasm::start`) keeps the panic's message and place; the worker catches the trap (from
//! a call, or as an uncaught error of the future's microtask), reads the message
//! (`takePanic`) and posts one `fatal` message. A panic on a thread of the CPU engine's
//! pool (the threaded build's Web Workers) traps that thread while the worker's own
//! thread waits for it, blocked: the hook there posts the message on the page's
//! `BroadcastChannel` (`setPanicChannel`), and the page takes it as the worker's `fatal`.
//! `pkg/index.js` fails that request with
//! code `Panic`, terminates the worker, starts a new one that loads the same model,
//! drafter and options (from Cache Storage), and then resends the requests that were
//! queued in the dead worker or made meanwhile (aborts of them go first). Requests queue
//! in the worker by default; `createEngine({ ifBusy: 'reject' })` refuses one made while
//! another is unanswered with `Busy` (`engine.pending` counts them). A lost device
//! (`GPUDevice.destroy()`, a driver reset) answers `DeviceLost` at the next request; a
//! new `createEngine` loads again. Test-only hooks (`engine.__testTrap(message)`,
//! `engine.__testLoseDevice()`) drive these paths in `tests/e2e/faults.test.mjs`; they
//! exist only in a package built with `DFLASH_TEST_HOOKS=1 scripts/build-pkg.sh`
//! (dflash-web's `test-hooks` feature, as `scripts/test.sh` builds it); a release
//! package's worker answers them `BadRequest`.
//!
//! How an interrupt reaches a running request: `dflash_core::generate`'s module docs
//! (`crates/dflash-core/src/generate.rs`); the error codes: `dflash_engine::errors`
//! (`crates/dflash-engine/src/errors.rs`).

mod engine;
mod js;
mod loader;
mod shapes;

use js::*;
use sha2::{Digest, Sha256};
use wasm_bindgen::prelude::*;

/// The last panic's message and place. A panic aborts the wasm instance with a trap
/// (`RuntimeError: unreachable`) that says nothing of its cause: the worker reads this
/// after catching the trap (`takePanic`) and hands it to the caller as code `Panic`.
static LAST_PANIC: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(s: &str);
}

/// The page's channel for panics on the pool's threads (`setPanicChannel`).
static PANIC_CHANNEL: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

thread_local! {
    /// Whether this is the worker's own thread (whose traps the worker catches).
    static WORKER_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Names the page's `BroadcastChannel` on which a panic on any other thread (the CPU
/// engine's pool) is posted, and marks the calling thread as the worker's own.
#[wasm_bindgen(js_name = setPanicChannel)]
pub fn set_panic_channel(name: String) {
    WORKER_THREAD.with(|w| w.set(true));
    if let Ok(mut g) = PANIC_CHANNEL.lock() {
        *g = Some(name);
    }
}

/// A panic on a thread of the pool: its message to the page, whose worker is blocked
/// waiting for this thread.
fn report_pool_panic(msg: &str) {
    if WORKER_THREAD.with(|w| w.get()) {
        return;
    }
    let Some(name) = PANIC_CHANNEL.lock().ok().and_then(|g| g.clone()) else {
        return;
    };
    if let Ok(c) = web_sys::BroadcastChannel::new(&name) {
        let _ = c.post_message(&JsValue::from_str(msg));
        c.close();
    }
}

/// Installs the panic hook when the module is instantiated.
#[wasm_bindgen(start)]
fn start() {
    std::panic::set_hook(Box::new(|info| {
        let payload = info.payload();
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        let msg = match info.location() {
            Some(l) => format!("{what} (at {}:{})", l.file(), l.line()),
            None => what,
        };
        console_error(&format!("dflash-web panicked: {msg}"));
        report_pool_panic(&msg);
        if let Ok(mut g) = LAST_PANIC.lock() {
            *g = Some(msg);
        }
    }));
}

/// The hex sha256 of a whole file (the drafter's files: checked against the hash the
/// page pinned and the one stored with a cached copy, as the model's are).
#[wasm_bindgen(js_name = sha256Hex)]
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The message of the panic that trapped the instance, once (null if none happened).
#[wasm_bindgen(js_name = takePanic)]
pub fn take_panic() -> Option<String> {
    LAST_PANIC.lock().ok().and_then(|mut g| g.take())
}

/// TEST ONLY: panics with `message` after yielding to the event loop once, so that the
/// trap comes from a running future, as a bug in a chat request's would.
#[cfg(feature = "test-hooks")]
#[wasm_bindgen(js_name = __testTrap)]
pub async fn test_trap(message: String) -> Result<(), JsValue> {
    yield_to_worker().await?;
    panic!("{message}");
}

/// TEST ONLY: panics with `message` on one thread of the CPU engine's pool while this
/// thread waits for them all (`rayon::broadcast`), as a bug in a parallel kernel would.
#[cfg(feature = "test-hooks")]
#[wasm_bindgen(js_name = __testPoolPanic)]
pub fn test_pool_panic(message: String) {
    rayon::broadcast(|ctx| {
        if ctx.index() == 0 {
            panic!("{message}");
        }
    });
}

/// TEST ONLY: this build's CPU kernels (wasm SIMD128) against the scalar definition on
/// random matrices, the packed one (`testutil::packed_kernel_mismatches`) and the
/// unpacked one K-quant models run (`testutil::unpacked_kernel_mismatches`):
/// `{ packed: { bad, all, kernels }, unpacked: { bad, all, kernels } }`, `bad` counting
/// values whose bits differ of `all` compared.
#[cfg(feature = "test-hooks")]
#[wasm_bindgen(js_name = __testKernels)]
pub fn test_kernels() -> Result<JsValue, JsValue> {
    use dflash_core::testutil::{packed_kernel_mismatches, unpacked_kernel_mismatches};
    let shape = |(bad, all, kernels): (usize, usize, Vec<&str>)| serde_json::json!({ "bad": bad, "all": all, "kernels": kernels });
    let v = serde_json::json!({
        "packed": shape(packed_kernel_mismatches()),
        "unpacked": shape(unpacked_kernel_mismatches()),
    });
    let ser = serde_wasm_bindgen::Serializer::json_compatible();
    serde::Serialize::serialize(&v, &ser).map_err(|e| JsValue::from_str(&e.to_string()))
}
