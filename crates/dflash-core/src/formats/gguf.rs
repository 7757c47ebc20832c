//! GGUF v2/v3 parser: metadata, tensor table and alignment, validated against the file
//! size before anything is allocated. Parsing reads only the header; tensor data is
//! sliced from the same byte buffer (a memory map natively).

use crate::error::{Error, Result};
use crate::formats::ggml::GgmlType;
use crate::limits::{
    MAX_GGUF_ARRAY_ITEMS, MAX_GGUF_HEADER_BYTES, MAX_GGUF_KEYS, MAX_GGUF_STRING_BYTES,
    MAX_GGUF_TENSORS,
};
use std::collections::{BTreeMap, HashSet};

pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// Tensors have at most 4 dimensions in GGUF.
const MAX_DIMS: u32 = 4;
/// Nesting of arrays inside arrays: GGUF files in the wild use none.
const MAX_ARRAY_DEPTH: u32 = 2;

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) if v >= 0 => Some(v as u64),
            Value::I16(v) if v >= 0 => Some(v as u64),
            Value::I32(v) if v >= 0 => Some(v as u64),
            Value::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64).or(match *self {
                Value::I8(v) => Some(v as f64),
                Value::I16(v) => Some(v as f64),
                Value::I32(v) => Some(v as f64),
                Value::I64(v) => Some(v as f64),
                _ => None,
            }),
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in GGUF order: `dims[0]` is the fastest-varying (columns).
    pub dims: Vec<u64>,
    pub dtype: GgmlType,
    /// Absolute byte offset of the tensor data in the file.
    pub offset: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// (rows, cols) of the tensor read as a matrix: a 2-D tensor, or a 3-D stack of
    /// matrices (a mixture's experts) one under the other; None for other ranks.
    pub fn matrix_shape(&self) -> Option<(usize, usize)> {
        match self.dims[..] {
            [cols, rows] => Some((rows as usize, cols as usize)),
            [cols, rows, n] => Some(((rows * n) as usize, cols as usize)),
            _ => None,
        }
    }
    /// Shape in row-major order (outermost first), as Hugging Face writes it.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

#[derive(Debug, Clone)]
pub struct GgufHeader {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_offset: u64,
}

impl GgufHeader {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(Value::as_u64)
    }
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(Value::as_f64)
    }
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Size of the whole file; `buf` may be a prefix of it.
    file_len: u64,
    /// Items of metadata arrays so far (`MAX_GGUF_ARRAY_ITEMS`).
    array_items: u64,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        let end = (self.pos as u64).saturating_add(n);
        if end > MAX_GGUF_HEADER_BYTES {
            return Err(Error::over_limit(
                "GGUF header bytes",
                end,
                "MAX_GGUF_HEADER_BYTES",
                MAX_GGUF_HEADER_BYTES,
            ));
        }
        if end <= self.buf.len() as u64 {
            let s = &self.buf[self.pos..end as usize];
            self.pos = end as usize;
            Ok(s)
        } else {
            Err(Error::Truncated {
                offset: self.pos as u64,
                needed: n,
                len: self.file_len,
            })
        }
    }
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }

    /// Checks a count read from the header (`count` things of at least `min_size` bytes
    /// each) before anything is allocated for it: against its limit, then against the
    /// bytes at hand. More than the buffer holds is `Truncated` when the rest of the file
    /// could hold it (a file cut short, or a stream that has not delivered it yet), and
    /// `AbsurdSize` when even the whole file could not.
    fn check_count(
        &self,
        field: &'static str,
        count: u64,
        min_size: u64,
        limit: &'static str,
        max: u64,
    ) -> Result<()> {
        if count > max {
            return Err(Error::over_limit(
                format!("GGUF {field}"),
                count,
                limit,
                max,
            ));
        }
        // count <= max < 2^32 and min_size <= 32: no overflow.
        let bytes = count * min_size;
        if bytes <= self.remaining() {
            return Ok(());
        }
        let in_file = self.file_len.saturating_sub(self.pos as u64);
        if self.buf.len() as u64 >= self.file_len || bytes <= in_file {
            Err(Error::Truncated {
                offset: self.pos as u64,
                needed: bytes,
                len: self.file_len,
            })
        } else {
            Err(Error::AbsurdSize {
                field,
                value: count,
                limit: in_file / min_size,
            })
        }
    }

    fn string(&mut self, field: &'static str) -> Result<String> {
        let len = self.u64()?;
        self.check_count(
            field,
            len,
            1,
            "MAX_GGUF_STRING_BYTES",
            MAX_GGUF_STRING_BYTES,
        )?;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| Error::BadMetadata(format!("{field} is not valid UTF-8")))
    }

    fn value(&mut self, type_id: u32, depth: u32) -> Result<Value> {
        Ok(match type_id {
            0 => Value::U8(self.u8()?),
            1 => Value::I8(self.u8()? as i8),
            2 => Value::U16(self.u16()?),
            3 => Value::I16(self.u16()? as i16),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(self.u32()? as i32),
            6 => Value::F32(f32::from_bits(self.u32()?)),
            7 => match self.u8()? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(Error::BadMetadata(format!("bool value {b}"))),
            },
            8 => Value::String(self.string("string length")?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(Error::BadMetadata("arrays nested too deeply".into()));
                }
                let item_type = self.u32()?;
                let count = self.u64()?;
                let min_item = min_value_size(item_type).ok_or_else(|| {
                    Error::BadMetadata(format!("unknown array item type {item_type}"))
                })?;
                let total = self.array_items.saturating_add(count);
                if total > MAX_GGUF_ARRAY_ITEMS {
                    return Err(Error::over_limit(
                        "GGUF metadata array items (all arrays together)",
                        total,
                        "MAX_GGUF_ARRAY_ITEMS",
                        MAX_GGUF_ARRAY_ITEMS,
                    ));
                }
                self.check_count(
                    "array length",
                    count,
                    min_item,
                    "MAX_GGUF_ARRAY_ITEMS",
                    MAX_GGUF_ARRAY_ITEMS,
                )?;
                self.array_items = total;
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(item_type, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(self.u64()? as i64),
            12 => Value::F64(f64::from_bits(self.u64()?)),
            t => return Err(Error::BadMetadata(format!("unknown value type {t}"))),
        })
    }
}

/// The fewest bytes a value of this type takes in the file.
fn min_value_size(type_id: u32) -> Option<u64> {
    Some(match type_id {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        10..=12 => 8,
        _ => return None,
    })
}

/// Parses the GGUF header from `buf`, which holds the file from its start (the whole
/// file, or a prefix long enough for the header). `file_len` is the size of the whole
/// file: every tensor must lie inside it.
pub fn parse_header(buf: &[u8], file_len: u64) -> Result<GgufHeader> {
    let mut r = Reader {
        buf,
        pos: 0,
        file_len,
        array_items: 0,
    };
    let version = r.magic_and_version()?;
    let tensor_count = r.u64()?;
    let kv_count = r.u64()?;
    // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor
    // info at least 8 + 4 + 8 + 4 + 8.
    r.check_count(
        "metadata count",
        kv_count,
        13,
        "MAX_GGUF_KEYS",
        MAX_GGUF_KEYS,
    )?;
    let metadata = r.metadata(kv_count)?;
    r.check_count(
        "tensor count",
        tensor_count,
        32,
        "MAX_GGUF_TENSORS",
        MAX_GGUF_TENSORS,
    )?;
    let alignment = alignment_of(&metadata)?;
    let mut raw = Vec::with_capacity(tensor_count as usize);
    for _ in 0..tensor_count {
        raw.push(r.raw_tensor_info()?);
    }
    let data_offset = align_up(r.pos as u64, alignment);
    let layout = DataLayout {
        alignment,
        data_offset,
        file_len,
    };
    let mut tensors = Vec::with_capacity(raw.len());
    for info in raw {
        tensors.push(layout.place(info)?);
    }
    check_disjoint(&tensors)?;
    Ok(GgufHeader {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

/// A tensor info record as it stands in the file, before its type and extent are checked.
struct RawTensorInfo {
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    offset: u64,
}

impl Reader<'_> {
    /// The "GGUF" magic and a supported version (2 or 3), the version returned.
    fn magic_and_version(&mut self) -> Result<u32> {
        let buf = self.buf;
        let magic = self.take(4).map_err(|_| Error::BadMagic {
            expected: "GGUF",
            found: buf[..buf.len().min(4)].to_vec(),
        })?;
        if magic != GGUF_MAGIC {
            return Err(Error::BadMagic {
                expected: "GGUF",
                found: magic.to_vec(),
            });
        }
        let version = self.u32()?;
        if version != 2 && version != 3 {
            return Err(Error::UnsupportedVersion(version));
        }
        Ok(version)
    }

    /// `kv_count` key-value pairs, a later duplicate key replacing the earlier one.
    fn metadata(&mut self, kv_count: u64) -> Result<BTreeMap<String, Value>> {
        let mut metadata = BTreeMap::new();
        for _ in 0..kv_count {
            let key = self.string("key length")?;
            let type_id = self.u32()?;
            let value = self.value(type_id, 0)?;
            metadata.insert(key, value);
        }
        Ok(metadata)
    }

    /// One tensor info record: name, dimensions (1 to `MAX_DIMS`), type id and offset.
    fn raw_tensor_info(&mut self) -> Result<RawTensorInfo> {
        let name = self.string("tensor name length")?;
        let n_dims = self.u32()?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(Error::BadTensorLayout {
                tensor: name,
                reason: format!("{n_dims} dimensions"),
            });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(self.u64()?);
        }
        let type_id = self.u32()?;
        let offset = self.u64()?;
        Ok(RawTensorInfo {
            name,
            dims,
            type_id,
            offset,
        })
    }
}

/// `general.alignment` when given (a power of two up to 1 MiB), else the default.
fn alignment_of(metadata: &BTreeMap<String, Value>) -> Result<u64> {
    match metadata.get("general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => Ok(a),
            _ => Err(Error::BadMetadata(format!(
                "general.alignment {v:?} is not a power of two"
            ))),
        },
    }
}

/// Where the tensor data lies in the file: what each tensor's extent is checked against.
struct DataLayout {
    alignment: u64,
    data_offset: u64,
    file_len: u64,
}

impl DataLayout {
    /// The tensor's type, size and absolute range, each checked in turn: a known,
    /// supported type, a non-empty shape whose rows are whole blocks, a size that fits
    /// 64 bits, an aligned offset and an end within the file.
    fn place(&self, raw: RawTensorInfo) -> Result<TensorInfo> {
        let RawTensorInfo {
            name,
            dims,
            type_id,
            offset,
        } = raw;
        let dtype = GgmlType::from_id(type_id).ok_or(Error::UnknownTensorType {
            tensor: name.clone(),
            type_id,
        })?;
        // A type we cannot load has no layout here to size it by: refused now, before
        // its (unknown) extent could be taken for something else.
        if !dtype.is_supported() {
            return Err(Error::UnsupportedTensorType {
                tensor: name,
                dtype: dtype.name(),
            });
        }
        let n_bytes = match tensor_bytes(&dims, dtype) {
            Ok(n) => n,
            Err(reason) => {
                return Err(Error::BadTensorLayout {
                    tensor: name,
                    reason,
                })
            }
        };
        let alignment = self.alignment;
        if offset % alignment != 0 {
            return Err(Error::BadTensorLayout {
                tensor: name,
                reason: format!("offset {offset} is not aligned to {alignment}"),
            });
        }
        let start = self.data_offset.checked_add(offset);
        let end = start.and_then(|s| s.checked_add(n_bytes));
        match (start, end) {
            (Some(s), Some(e)) if e <= self.file_len => Ok(TensorInfo {
                name,
                dims,
                dtype,
                offset: s,
                n_bytes,
            }),
            _ => Err(Error::TensorOutOfBounds {
                tensor: name,
                start: start.unwrap_or(u64::MAX),
                end: end.unwrap_or(u64::MAX),
                file_len: self.file_len,
            }),
        }
    }
}

/// The byte size of a tensor of `dims` in `dtype`, or why its shape is refused: no
/// elements (or a count past 64 bits), rows not whole blocks, or a size past 64 bits.
fn tensor_bytes(dims: &[u64], dtype: GgmlType) -> std::result::Result<u64, String> {
    let n_el = dims
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("dims {dims:?}"))?;
    let (block, bytes) = dtype.block_size();
    if !dims[0].is_multiple_of(block as u64) {
        return Err(format!(
            "row length {} is not a multiple of the {} block {}",
            dims[0],
            dtype.name(),
            block
        ));
    }
    (n_el / block as u64)
        .checked_mul(bytes as u64)
        .ok_or_else(|| format!("{n_el} elements of {} overflow a 64-bit size", dtype.name()))
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// Tensor names are unique and their byte ranges do not overlap: each tensor's data is
/// its own (the streaming loader hands the bytes out once, in file order).
fn check_disjoint(tensors: &[TensorInfo]) -> Result<()> {
    let mut names = HashSet::with_capacity(tensors.len());
    for t in tensors {
        if !names.insert(t.name.as_str()) {
            return Err(Error::BadTensorLayout {
                tensor: t.name.clone(),
                reason: "the name appears twice in the tensor table".into(),
            });
        }
    }
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| (t.offset, t.n_bytes));
    for w in order.windows(2) {
        let (a, b) = (w[0], w[1]);
        if b.offset < a.offset + a.n_bytes {
            return Err(Error::TensorOverlap {
                first: a.name.clone(),
                first_start: a.offset,
                first_end: a.offset + a.n_bytes,
                second: b.name.clone(),
                second_start: b.offset,
            });
        }
    }
    Ok(())
}

/// Writes GGUF files: used by tests to make small models in the real format, and by
/// tools that convert models.
pub mod writer {
    use super::Value;
    use crate::formats::ggml::GgmlType;

    pub struct TensorData {
        pub name: String,
        pub dims: Vec<u64>,
        pub dtype: GgmlType,
        pub bytes: Vec<u8>,
    }

    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }

    fn type_id(v: &Value) -> u32 {
        match v {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    fn put_value(out: &mut Vec<u8>, v: &Value) {
        match v {
            Value::U8(x) => out.push(*x),
            Value::I8(x) => out.push(*x as u8),
            Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::Bool(x) => out.push(*x as u8),
            Value::String(s) => put_str(out, s),
            Value::Array(items) => {
                let t = items.first().map(type_id).unwrap_or(4);
                out.extend_from_slice(&t.to_le_bytes());
                out.extend_from_slice(&(items.len() as u64).to_le_bytes());
                for i in items {
                    put_value(out, i);
                }
            }
            Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        }
    }

    /// Serialises a GGUF v3 file with 32-byte alignment.
    pub fn write(metadata: &[(String, Value)], tensors: &[TensorData]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
        for (k, v) in metadata {
            put_str(&mut out, k);
            out.extend_from_slice(&type_id(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for t in tensors {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.dtype.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.bytes.len() as u64).div_ceil(32) * 32;
        }
        let data_start = out.len().div_ceil(32) * 32;
        out.resize(data_start, 0);
        for (t, off) in tensors.iter().zip(offsets) {
            out.resize(data_start + off as usize, 0);
            out.extend_from_slice(&t.bytes);
        }
        out
    }
}
