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
//! (`takePanic`) and posts one `fatal` message. `pkg/index.js` fails that request with
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

/// TEST ONLY: this build's packed CPU kernel (wasm SIMD128) against the scalar
/// definition on random matrices (`testutil::packed_kernel_mismatches`): `[values whose
/// bits differ, values compared]`.
#[cfg(feature = "test-hooks")]
#[wasm_bindgen(js_name = __testPackedKernel)]
pub fn test_packed_kernel() -> Vec<u32> {
    let (bad, all, _) = dflash_core::testutil::packed_kernel_mismatches();
    vec![bad as u32, all as u32]
}
