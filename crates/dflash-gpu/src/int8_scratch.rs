//! The device's shared 8-bit-activation scratch (`GpuContext::int8_scratch`), filled and
//! read by `ops::dp4a` (`reserve_scratch`, `QuantizedActivations::scratch`): plain
//! buffers here, so that the device layer holds it without the ops above it.

/// The context's quantized-activation buffers, shared by every GEMV of every plan on the
/// device (a pass's dispatches run in order, each quantize just before its GEMV): grown
/// to the widest input asked for so far, for 16 rows.
#[derive(Clone)]
pub struct Int8Scratch {
    pub(crate) cols: usize,
    pub(crate) qs: wgpu::Buffer,
    pub(crate) scales_sums: wgpu::Buffer,
}

impl Int8Scratch {
    pub fn cols(&self) -> usize {
        self.cols
    }
}
