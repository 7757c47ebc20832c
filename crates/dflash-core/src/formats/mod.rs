//! Model file formats: GGUF, ggml tensor types, Hugging Face safetensors folders.

pub mod ggml;
pub mod gguf;
pub mod gguf_source;
pub mod gguf_stream;
pub mod gguf_weights_stream;
pub mod hf;
