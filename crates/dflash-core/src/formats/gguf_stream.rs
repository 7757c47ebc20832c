//! A GGUF file read front to back in chunks, as a network or cache stream delivers it,
//! holding at most the header and the bytes of the tensor being completed: the browser
//! loads a model without ever having the whole file in wasm memory (2 GB ArrayBuffer
//! and 4 GB wasm limits), and can hash the stream as it passes.

use crate::error::{Error, Result};
use crate::formats::gguf::{parse_header, GgufHeader, TensorInfo};
use crate::limits::MAX_STREAM_TENSOR_BYTES;

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

    /// The header, once the stream is done with.
    pub fn into_header(self) -> Option<GgufHeader> {
        self.header
    }

    pub fn received(&self) -> u64 {
        self.received
    }

    /// Bytes held now: the header while it is incomplete, then at most the part of the
    /// next tensor that has arrived (padding and bytes after the last tensor are dropped).
    pub fn buffered(&self) -> usize {
        self.buf.len()
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
        if self.header.is_none() && !self.read_header()? {
            return Ok(vec![]);
        }
        self.complete_tensors()
    }

    /// Parses the header from the bytes buffered, when enough have arrived: true once it
    /// is read, false while it waits for more.
    fn read_header(&mut self) -> Result<bool> {
        let complete = self.received == self.total;
        if self.buf.len() < self.parse_at && !complete {
            return Ok(false);
        }
        match parse_header(&self.buf, self.total) {
            Ok(h) => {
                check_tensor_sizes(&h)?;
                let mut order: Vec<usize> = (0..h.tensors.len()).collect();
                order.sort_by_key(|&i| h.tensors[i].offset);
                self.order = order;
                self.header = Some(h);
                Ok(true)
            }
            // The header goes on past what has arrived: wait for more, unless the
            // bytes it needs lie past the announced end (then it never completes).
            Err(Error::Truncated { offset, needed, .. })
                if !complete && offset.saturating_add(needed) <= self.total =>
            {
                self.parse_at = self.buf.len() * 2;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// The tensors whose bytes have all arrived, in file order, dropping the bytes
    /// between and after them; the part of the next one that has arrived stays buffered.
    fn complete_tensors(&mut self) -> Result<Vec<StreamTensor>> {
        let h = self.header.as_ref().expect("header parsed above");
        let mut done = Vec::new();
        loop {
            let Some(t) = self.order.get(self.next).map(|&i| &h.tensors[i]) else {
                // Every tensor is out: what follows is not kept.
                self.base += self.buf.len() as u64;
                self.buf.clear();
                break;
            };
            // Bytes before this tensor (the header, padding) are not kept either. Tensors
            // are disjoint and in file order (`parse_header` checks), so the next one
            // never starts before `base`.
            let gap = t
                .offset
                .checked_sub(self.base)
                .ok_or_else(|| Error::TensorOverlap {
                    first: "(bytes already handed out)".into(),
                    first_start: 0,
                    first_end: self.base,
                    second: t.name.clone(),
                    second_start: t.offset,
                })?;
            let have = self.buf.len() as u64;
            if gap >= have {
                self.base += have;
                self.buf.clear();
                break;
            }
            self.buf.drain(..gap as usize);
            self.base = t.offset;
            // n_bytes <= MAX_STREAM_TENSOR_BYTES (checked by `read_header`): fits a usize.
            let n = t.n_bytes as usize;
            if n > self.buf.len() {
                break;
            }
            done.push(StreamTensor {
                info: t.clone(),
                bytes: self.buf.drain(..n).collect(),
            });
            self.base += t.n_bytes;
            self.next += 1;
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

/// Every tensor fits `MAX_STREAM_TENSOR_BYTES` (the stream buffers one whole tensor).
fn check_tensor_sizes(h: &GgufHeader) -> Result<()> {
    if let Some(t) = h
        .tensors
        .iter()
        .find(|t| t.n_bytes > MAX_STREAM_TENSOR_BYTES)
    {
        return Err(Error::over_limit(
            format!("bytes of tensor {}", t.name),
            t.n_bytes,
            "MAX_STREAM_TENSOR_BYTES",
            MAX_STREAM_TENSOR_BYTES,
        ));
    }
    Ok(())
}
