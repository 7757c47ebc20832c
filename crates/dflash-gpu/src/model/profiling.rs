//! The target model measured (native only): every dispatch of a pass timed on the GPU,
//! the host's times of a step, the GEMV bandwidth over its weights and the relative cost
//! of a pass per row count.

use super::{GpuModel, OutputHead};
use crate::context::GpuContext;
use crate::error::Result;
use crate::ops;
use crate::pipelines::Dispatch;
use crate::upload::work_buffer;

impl GpuModel {
    /// Every dispatch of a pass of `n` rows at position `pos` timed on the GPU (the
    /// profiler); the committed length is left as it was.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn profile_pass(
        &mut self,
        n: usize,
        head: OutputHead,
        pos: usize,
        runs: usize,
        now: &dyn Fn() -> f64,
    ) -> Result<crate::profile::PlanProfile> {
        let keep = self.len;
        self.len = pos.min(self.context.saturating_sub(n));
        self.kv_ids.truncate(self.len);
        self.drafted = self.drafted.min(self.len);
        let r = self.prepare_pass(&vec![0; n], head);
        let keys = self.len + n;
        self.len = keep;
        r?;
        let plan: Vec<&Dispatch> = self.plans[&(n, head)].iter().collect();
        let name = format!("{n}-row pass at {pos}");
        crate::profile::profile_plan(&self.ctx, &name, &plan, &[], keys, runs, now)
    }

    /// Host times of ordinary one-row steps at the current length (the median of
    /// `steps`): encoding, submission, and waiting for the mapped token.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn host_times(
        &mut self,
        steps: usize,
        now: &dyn Fn() -> f64,
    ) -> Result<crate::profile::HostTimes> {
        let mut t = (Vec::new(), Vec::new(), Vec::new());
        let mut token = 0;
        for _ in 0..steps.max(1) {
            self.prepare_pass(&[token], OutputHead::Argmax)?;
            let t0 = now();
            let cb = self.encode_pass(1, OutputHead::Argmax);
            let t1 = now();
            self.ctx.queue.submit([cb]);
            let t2 = now();
            let bytes = self.ctx.read_mapped(&self.act.readback)?;
            let t3 = now();
            self.record_ids(self.len, &[token]);
            self.len += 1;
            token = bytemuck::cast_slice::<u8, u32>(&bytes)[0];
            t.0.push(t1 - t0);
            t.1.push(t2 - t1);
            t.2.push(t3 - t2);
        }
        use crate::profile::median;
        Ok(crate::profile::HostTimes {
            encode: median(&mut t.0),
            submit: median(&mut t.1),
            map: median(&mut t.2),
        })
    }

    /// GB/s of the one-row GEMV over every weight matrix of the model (the decode
    /// traffic: weights, x and y, counted as the copy kernel counts its bytes), `reps`
    /// repetitions per pass, GPU timestamps where the adapter has them.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn gemv_gbps(&self, reps: usize, trials: usize, now: &dyn Fn() -> f64) -> Result<f64> {
        let ctx: &GpuContext = &self.ctx;
        let mats = self.weight_matrices();
        let cols = mats.iter().map(|m| m.cols).max().unwrap_or(1);
        let rows = mats.iter().map(|m| m.rows).max().unwrap_or(1);
        let x = work_buffer(ctx, "gemv_x", 4 * cols as u64);
        let y = work_buffer(ctx, "gemv_y", 4 * rows as u64);
        let mut d = Vec::new();
        for m in mats {
            d.extend(ops::gemv(ctx, m, &x, &y, 1, false)?);
        }
        crate::profile::gbps(ctx, &d.iter().collect::<Vec<_>>(), reps, trials, now)
    }

    /// Measured cost of a pass over b rows relative to one row, for b in 0..=max (index 0
    /// unused): the device-specific input of the adaptive block size. Call it before a
    /// prefill: it runs passes over the first 16 positions of the KV cache.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn measure_row_costs(&mut self, max: usize, now: &dyn Fn() -> f64) -> Result<Vec<f64>> {
        let keep = self.len;
        let probe = [1, 2, 4, 8, 16]
            .into_iter()
            .filter(|&b| b <= max.min(self.context))
            .collect::<Vec<_>>();
        let mut times = Vec::new();
        for &b in &probe {
            let toks = vec![0u32; b];
            self.truncate(0);
            self.step(&toks)?; // compile and warm up
            let mut best = f64::INFINITY;
            for _ in 0..2 {
                self.truncate(0);
                let t0 = now();
                self.step(&toks)?;
                best = best.min(now() - t0);
            }
            times.push((b, best));
        }
        self.len = keep;
        self.kv_ids.truncate(keep);
        Ok(dflash_core::speculative::interpolate_costs(&times, max))
    }
}
