//! The edge to JavaScript: the engine's typed errors as `DFlashError`s, JSON values as
//! JS objects, and a yield to the worker's event loop.

use dflash_engine::errors::error_code;
use dflash_gpu::GpuError;
use serde::Serialize;
use wasm_bindgen::prelude::*;

/// An error for JS: `Error` with `name` "DFlashError" and the engine's `code`.
pub(super) fn to_js(e: &GpuError) -> JsValue {
    js_error(error_code(e), &e.to_string())
}

pub(super) fn js_error(code: &str, message: &str) -> JsValue {
    let err = js_sys::Error::new(message);
    err.set_name("DFlashError");
    let _ = js_sys::Reflect::set(&err, &"code".into(), &code.into());
    err.into()
}

pub(super) fn core_err(e: dflash_core::Error) -> JsValue {
    to_js(&GpuError::Core(e))
}

pub(super) fn gpu_err(e: GpuError) -> JsValue {
    to_js(&e)
}

pub(super) fn to_js_value(v: &serde_json::Value) -> JsValue {
    v.serialize(&serde_wasm_bindgen::Serializer::json_compatible())
        .unwrap_or(JsValue::NULL)
}

/// Lower-case hex of `bytes`.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Lets the worker's event loop run (messages such as an interrupt) and resumes at once:
/// a message to ourselves through a `MessageChannel` (a zero-delay `setTimeout` is
/// clamped to 4 ms once nested).
pub(super) async fn yield_to_worker() -> Result<(), JsValue> {
    use js_sys::{Array, Function, Promise, Reflect};
    let global = js_sys::global();
    let ctor: Function = Reflect::get(&global, &"MessageChannel".into())?.dyn_into()?;
    let channel = Reflect::construct(&ctor, &Array::new())?;
    let (rx, tx) = (
        Reflect::get(&channel, &"port1".into())?,
        Reflect::get(&channel, &"port2".into())?,
    );
    let arrived = Promise::new(&mut |resolve, _| {
        let _ = Reflect::set(&rx, &"onmessage".into(), &resolve);
    });
    let post: Function = Reflect::get(&tx, &"postMessage".into())?.dyn_into()?;
    post.call1(&tx, &JsValue::NULL)?;
    wasm_bindgen_futures::JsFuture::from(arrived).await?;
    Ok(())
}
