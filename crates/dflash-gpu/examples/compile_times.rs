//! Seconds to compile each GEMV variant the plans use, on the default adapter with a
//! given tuning: `cargo run --release --example compile_times -- LANES`.
use dflash_gpu::context::Tuning;
use dflash_gpu::pipelines::{Kernel, Shader};
use dflash_gpu::{GpuContext, GpuOptions};
use std::time::Instant;

fn main() {
    let lanes: usize = std::env::args().nth(1).map_or(16, |s| s.parse().unwrap());
    let ctx = GpuContext::new(&GpuOptions {
        tuning: Some(Tuning::gpu().with_uniform_lanes(lanes, 1)),
        ..Default::default()
    })
    .unwrap();
    for (entry, norm, bias, pair, acc) in [
        ("main", 0.0, 0.0, 0.0, 1.0),
        ("main", 1.0, 0.0, 0.0, 0.0),
        ("main", 1.0, 1.0, 0.0, 0.0),
        ("main", 1.0, 0.0, 1.0, 0.0),
        ("main", 0.0, 0.0, 1.0, 0.0),
        ("main_argmax", 1.0, 0.0, 0.0, 0.0),
        ("main_argmax", 0.0, 0.0, 0.0, 0.0),
    ] {
        for n in [1.0, 4.0, 16.0] {
            let k = Kernel::new(Shader::Gemv, entry)
                .with("FORMAT", 0.0)
                .with("GROUP", 32.0)
                .with("ACCUMULATE", acc)
                .with("N_ROWS", n)
                .with("LANES", lanes as f64)
                .with("NORM", norm)
                .with("BIAS", bias)
                .with("PAIR", pair);
            let t = Instant::now();
            let pl = ctx.pipelines.get(&ctx, &k).unwrap();
            let layout = pl.get_bind_group_layout(0);
            let _ = layout;
            let bufs: Vec<wgpu::Buffer> = (0..9)
                .map(|i| {
                    ctx.device.create_buffer(&wgpu::BufferDescriptor {
                        label: None,
                        size: if i == 0 { 256 } else { 1 << 20 },
                        usage: if i == 0 {
                            wgpu::BufferUsages::UNIFORM
                        } else {
                            wgpu::BufferUsages::STORAGE
                        },
                        mapped_at_creation: false,
                    })
                })
                .collect();
            let entries: Vec<wgpu::BindGroupEntry> = (0..9u32)
                .filter(|&b| entry == "main_argmax" || b != 8)
                .map(|b| wgpu::BindGroupEntry {
                    binding: b,
                    resource: bufs[b as usize].as_entire_binding(),
                })
                .collect();
            let bg = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &pl.get_bind_group_layout(0),
                entries: &entries,
            });
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&pl);
                pass.set_bind_group(0, &bg, &[]);
                pass.dispatch_workgroups(1, 1, 1);
            }
            ctx.queue.submit([enc.finish()]);
            ctx.wait().unwrap();
            println!(
                "{entry} norm={norm} bias={bias} pair={pair} n={n}: {:.2} s",
                t.elapsed().as_secs_f64()
            );
        }
    }
}
