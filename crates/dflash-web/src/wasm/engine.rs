//! `Engine`: the loaded model answering chat requests one at a time through
//! `dflash_engine` (the browser worker as its host), each in OpenAI's shape, streamed
//! chunk by chunk to a callback.

use super::js::*;
use dflash_core::generate::Interrupt;
use dflash_engine::request::{request_fields as engine_request_fields, Request};
use dflash_engine::response::Reply;
use dflash_engine::{Engine as Core, Host};
use dflash_gpu::GpuError;
use std::cell::RefCell;
use std::rc::Rc;
use wasm_bindgen::prelude::*;

/// The request parsed and checked as `Engine::chat` does before it runs.
pub(super) fn parse_request(request: JsValue) -> Result<Request, JsValue> {
    refuse_non_finite_numbers(&request)?;
    let v: serde_json::Value = serde_wasm_bindgen::from_value(request)
        .map_err(|e| js_error("BadRequest", &format!("bad request: {e}")))?;
    Request::chat(v).map_err(core_err)
}

/// NaN and Infinity in a top-level field: a typed error naming it. JSON has neither, and
/// serde_wasm_bindgen would turn them into null, which means "the default" (OpenAI's
/// clients send explicit nulls): `temperature: NaN` would silently take the default.
fn refuse_non_finite_numbers(request: &JsValue) -> Result<(), JsValue> {
    let Some(obj) = request.dyn_ref::<js_sys::Object>() else {
        return Ok(());
    };
    for entry in js_sys::Object::entries(obj).iter() {
        let pair = js_sys::Array::from(&entry);
        if let Some(x) = pair.get(1).as_f64().filter(|x| !x.is_finite()) {
            let k = pair.get(0).as_string().unwrap_or_default();
            return Err(js_error(
                "BadRequest",
                &format!("`{k}` is {x}: give a finite number, or null or nothing for the default"),
            ));
        }
    }
    Ok(())
}

/// A loaded model (and drafter) answering chat requests one at a time.
#[wasm_bindgen]
pub struct Engine {
    pub(super) inner: Rc<RefCell<Option<Core>>>,
    pub(super) info: serde_json::Value,
    /// The running request's interrupt switch (outside `inner`, which the request holds).
    pub(super) interrupt: Interrupt,
}

#[wasm_bindgen]
impl Engine {
    /// Adapter, context, drafter and the model file's sha256.
    pub fn info(&self) -> JsValue {
        to_js_value(&self.info)
    }

    /// Answers an OpenAI-style chat request in OpenAI's shape, named by `envelope`
    /// (`{ id, created, model }`): resolves to the whole `chat.completion`; with
    /// `on_chunk`, streams its `chat.completion.chunk`s as they are generated (the role,
    /// each piece with `dflash.drafted` and `dflash.token_ids`, the finish with the usage, and include_usage's).
    pub fn chat(
        &self,
        request: JsValue,
        envelope: JsValue,
        on_chunk: Option<js_sys::Function>,
    ) -> js_sys::Promise {
        let inner = self.inner.clone();
        let interrupt = self.interrupt.clone();
        wasm_bindgen_futures::future_to_promise(answer(
            inner, interrupt, request, envelope, on_chunk,
        ))
    }

    /// TEST ONLY: destroys the engine's GPU device (`GPUDevice.destroy()`, what a driver
    /// reset does): later requests fail with code `DeviceLost`. Nothing on the CPU engine.
    #[cfg(feature = "test-hooks")]
    #[wasm_bindgen(js_name = __testLoseDevice)]
    pub fn test_lose_device(&self) -> Result<(), JsValue> {
        let g = self
            .inner
            .try_borrow()
            .map_err(|_| js_error("Busy", "the engine is answering a request"))?;
        if let Some(ctx) = g.as_ref().and_then(|e| e.runner.gpu_context()) {
            ctx.destroy_device();
        }
        Ok(())
    }

    /// Forgets the conversation: the next request prefills its whole prompt instead of
    /// keeping the KV rows its longest common prefix with the last one shares.
    #[wasm_bindgen(js_name = resetChat)]
    pub fn reset_chat(&self) -> Result<(), JsValue> {
        let mut g = self
            .inner
            .try_borrow_mut()
            .map_err(|_| js_error("Busy", "the engine is answering a request"))?;
        if let Some(e) = g.as_mut() {
            e.runner.forget_conversation();
        }
        Ok(())
    }

    /// Ends the running request before its next token (it resolves with what it has,
    /// `finish_reason: "abort"`); the engine stays usable. The GPU engine yields to the
    /// worker between steps, the CPU engine between tokens of plain decoding and between
    /// DFlash steps, so this takes effect within one step.
    pub fn interrupt(&self) {
        self.interrupt.set();
    }

    /// Frees the model (GPU buffers or CPU weights); later requests fail with code
    /// `Unloaded`.
    pub fn unload(&self) -> Result<(), JsValue> {
        let mut g = self
            .inner
            .try_borrow_mut()
            .map_err(|_| js_error("Busy", "the engine is answering a request"))?;
        *g = None;
        Ok(())
    }
}

/// The browser worker as the engine's host: its clock, `Math.random` seeds, and a yield
/// to the worker's event loop between steps (where an interrupt arrives).
pub(super) struct Worker;

impl Host for Worker {
    fn now_s(&self) -> f64 {
        js_sys::Date::now() / 1000.0
    }

    fn random_seed(&self) -> u64 {
        (js_sys::Math::random() * 9007199254740992.0) as u64
    }

    async fn pause(&self) -> Result<(), GpuError> {
        yield_to_worker().await.map_err(|e| {
            dflash_core::Error::Internal(format!("yielding to the worker failed: {e:?}")).into()
        })
    }
}

/// `Engine::chat`'s request, run to its end: the engine stays borrowed throughout (a
/// request meanwhile is `Busy`; the borrow is how the engine answers one at a time).
#[allow(
    clippy::await_holding_refcell_ref,
    reason = "the borrow held across the run is the engine's busy state"
)]
pub(super) async fn answer(
    inner: Rc<RefCell<Option<Core>>>,
    interrupt: Interrupt,
    request: JsValue,
    envelope: JsValue,
    on_chunk: Option<js_sys::Function>,
) -> Result<JsValue, JsValue> {
    let req = parse_request(request)?;
    let reply = parse_envelope(&req, envelope)?;
    let mut guard = inner
        .try_borrow_mut()
        .map_err(|_| js_error("Busy", "the engine is answering another request"))?;
    let engine = guard
        .as_mut()
        .ok_or_else(|| js_error("Unloaded", "the engine was unloaded"))?;
    let emit = |chunk: &serde_json::Value| {
        if let Some(f) = &on_chunk {
            let _ = f.call1(&JsValue::NULL, &to_js_value(chunk));
        }
    };
    if let Some(first) = reply.first_chunk() {
        emit(&first);
    }
    interrupt.clear();
    let a = engine
        .answer(&req, &interrupt, &Worker, &mut |p| {
            emit(&reply.piece_chunk(&p))
        })
        .await
        .map_err(|e| to_js(&e))?;
    reply.last_chunks(&a).iter().for_each(emit);
    Ok(to_js_value(&reply.whole(&a.result.text, &a)))
}

/// The answer's envelope: `{ id, created, model }` as the package names the request.
pub(super) fn parse_envelope(req: &Request, envelope: JsValue) -> Result<Reply, JsValue> {
    #[derive(serde::Deserialize)]
    struct Envelope {
        id: String,
        created: u64,
        model: String,
    }
    let e: Envelope = serde_wasm_bindgen::from_value(envelope)
        .map_err(|e| js_error("BadRequest", &format!("bad envelope: {e}")))?;
    Ok(Reply::new(req, e.id, e.created, e.model))
}

/// Every field a chat request may have (`index.d.ts` declares exactly these).
#[wasm_bindgen(js_name = requestFields)]
pub fn request_fields() -> Vec<String> {
    engine_request_fields().map(String::from).collect()
}

/// Checks a chat request without a model (fields, types, sampling parameters): throws
/// the `{ code: 'BadRequest', message }` error the engine would.
#[wasm_bindgen(js_name = validateRequest)]
pub fn validate_request(request: JsValue) -> Result<(), JsValue> {
    parse_request(request).map(|_| ())
}
