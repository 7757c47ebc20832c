//! dflash-web in the browser: the engine (`dflash-engine` over dflash-core and
//! dflash-gpu) built for wasm32 and driven from a Web Worker (`pkg/worker.js`). This
//! crate only adds the edge: the wasm-bindgen surface (`Loader`, `Engine`, `planShape`,
//! `shapeInfo`, `validateRequest`, `requestFields`, `sha256Hex`, `takePanic`, and
//! `initThreadPool` in the threaded build), wrapped by `pkg/index.js`, and the engine's
//! typed errors as JS errors. The fault tests' hooks (`__testTrap`, `__testLoseDevice`)
//! exist only with the `test-hooks` feature.

#[cfg(target_arch = "wasm32")]
mod wasm;

/// `initThreadPool(n)`: starts the CPU engine's `n` threads (the threaded build only).
#[cfg(all(target_arch = "wasm32", feature = "threads"))]
pub use wasm_bindgen_rayon::init_thread_pool;
