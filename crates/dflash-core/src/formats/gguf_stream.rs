//! A GGUF file read front to back in chunks, as a network or cache stream delivers it,
//! holding at most the header and the bytes of the tensor being completed: the browser
//! loads a model without ever having the whole file in wasm memory (2 GB ArrayBuffer
//! and 4 GB wasm limits), and can hash the stream as it passes.

use crate::error::{Error, Result};
use crate::formats::gguf::{parse_header, GgufHeader, TensorInfo};

pub struct GgufStream {
    total: u64,
    /// Bytes received and not yet handed out; `buf[0]` is at file offset `base`.
    buf: Vec<u8>,
    base: u64,
    received: u64,
    header: Option<GgufHeader>,
    /// Tensor indices in file order, and the next one to complete.
    order: Vec<usize>,
    next: usize,
    /// Parse the header again once this many bytes are buffered (doubling, so a long
    /// header costs a few parses, not one per chunk).
    parse_at: usize,
}

/// One tensor whose bytes have all arrived.
pub struct StreamTensor {
    pub info: TensorInfo,
    pub bytes: Vec<u8>,
}

impl GgufStream {
    /// A stream over a file of `total` bytes (Content-Length or `File.size`).
    pub fn new(total: u64) -> Self {
        GgufStream {
            total,
            buf: Vec::new(),
            base: 0,
            received: 0,
            header: None,
            order: Vec::new(),
            next: 0,
            parse_at: 4096,
        }
    }

    pub fn header(&self) -> Option<&GgufHeader> {
        self.header.as_ref()
    }

    pub fn received(&self) -> u64 {
        self.received
    }

    /// Appends the next bytes of the file; returns the tensors they complete, in file
    /// order. Bytes past the announced length are an error.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<StreamTensor>> {
        self.received += chunk.len() as u64;
        if self.received > self.total {
            return Err(Error::BadMetadata(format!(
                "the stream is longer than the {} bytes announced",
                self.total
            )));
        }
        self.buf.extend_from_slice(chunk);
        if self.header.is_none() {
            let complete = self.received == self.total;
            if self.buf.len() < self.parse_at && !complete {
                return Ok(vec![]);
            }
            match parse_header(&self.buf, self.total) {
                Ok(h) => {
                    let mut order: Vec<usize> = (0..h.tensors.len()).collect();
                    order.sort_by_key(|&i| h.tensors[i].offset);
                    self.order = order;
                    self.header = Some(h);
                }
                Err(Error::Truncated { .. }) if !complete => {
                    self.parse_at = self.buf.len() * 2;
                    return Ok(vec![]);
                }
                Err(e) => return Err(e),
            }
        }
        let h = self.header.as_ref().expect("header parsed above");
        let mut done = Vec::new();
        while let Some(&i) = self.order.get(self.next) {
            let t = &h.tensors[i];
            let end = t.offset + t.n_bytes;
            if end > self.base + self.buf.len() as u64 {
                break;
            }
            let s = (t.offset - self.base) as usize;
            done.push(StreamTensor {
                info: t.clone(),
                bytes: self.buf[s..s + t.n_bytes as usize].to_vec(),
            });
            self.next += 1;
            // Drop everything before the end of this tensor (tensors never overlap).
            let cut = (end - self.base) as usize;
            self.buf.drain(..cut);
            self.base = end;
        }
        Ok(done)
    }

    /// Checks that the whole file arrived and every tensor was handed out.
    pub fn finish(&self) -> Result<()> {
        if self.received < self.total || self.header.is_none() || self.next < self.order.len() {
            return Err(Error::Truncated {
                offset: self.received,
                needed: self.total.saturating_sub(self.received),
                len: self.total,
            });
        }
        Ok(())
    }
}
