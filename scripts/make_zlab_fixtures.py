#!/usr/bin/env python3
"""Makes the z-lab reference fixtures in fixtures/zlab/ (run by hand, never by CI).

The reference is z-lab's own DFlash/DFlash2 code, the PyPI package `dflash==0.1.0`
(module `dflash/model.py`), run on the CPU in float32. Exact versions used for the
committed fixtures:

    Python        3.11.7
    torch         2.11.0   (PyPI's CUDA build, run on the CPU)
    transformers  5.17.0
    tokenizers    0.23.3   (comes with transformers; writes the tiny tokenizer.json)
    safetensors   0.8.0
    numpy         2.4.6
    accelerate    1.15.0, gguf 0.19.0 (installed, not used here)
    dflash        0.1.0    (installed with --no-deps: its pins want other versions)

The venv and the command that produced the committed fixtures:

    python3 -m venv /tmp/zvenv
    /tmp/zvenv/bin/pip install torch==2.11.0 transformers==5.17.0 gguf accelerate safetensors numpy
    /tmp/zvenv/bin/pip install --no-deps dflash==0.1.0
    /tmp/zvenv/bin/python scripts/make_zlab_fixtures.py fixtures/zlab

It takes a few minutes on 2 cores and rewrites the output folder from scratch. (For
trials only, never for the committed files: ZLAB_ONLY=<case> makes one case,
ZLAB_TRAIN_STEPS=<n> overrides the training steps.) Everything
is seeded; CPU float32 throughout (no CUDA is touched: `_cuda_time` is replaced by
`time.perf_counter` so that `dflash_generate(..., return_stats=True)` runs on the CPU).

What it writes (fixtures/zlab/README.md lists every file, array name, shape and dtype):
  * targets/<name>/: tiny random targets built with transformers' own classes (Qwen3 with
    q/k norms and GQA, Llama with GQA 4:1 and tied embeddings, Qwen2 with q/k/v biases),
    saved with `save_pretrained` (config.json, generation_config.json,
    model.safetensors, float32), plus a word-level tokenizer.json of the model's vocabulary
    (tokens "<0>".."<V-1>") because our engine's Hugging Face loader requires one; the
    fixtures use token ids only.
  * <case>/drafter/: a drafter made and saved by the reference's own classes
    (`DFlashDraftModel` / `DFlash2DraftModel`, `save_pretrained`), weights scaled and then
    briefly trained (self-distillation on the target's greedy output, the reference's own
    forward) so that drafts are neither constant nor always wrong.
  * <case>/reference.json and <case>/reference.safetensors: the reference's outputs.
  * layer_ids.json: `build_target_layer_ids(N, n)` over a grid.
  * sampling.json: `_sampling_probs` and `_rejection_sample` on fixed inputs.
"""
import json
import math
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import safetensors
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

import dflash.model as dm
from dflash.model import (
    DFlash2DraftModel,
    DFlashDraftModel,
    _draft_value,
    _output_head,
    _raw_input_embeddings,
    _rejection_sample,
    _sampling_probs,
    build_target_layer_ids,
    dflash_generate,
    extract_context_feature,
)
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
import transformers

# dflash_generate(return_stats=True) times itself with torch.cuda.synchronize().
dm._cuda_time = time.perf_counter

torch.set_num_threads(2)
DEVICE = "cpu"
MAX_NEW_TOKENS = 24

# ---------------------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------------------

TARGETS = {
    # Qwen3: q/k norms, GQA 2:1, untied lm_head. Scaled for varied greedy output (a new
    # token almost every step: drafts are rarely accepted).
    "qwen3": dict(
        cls=(Qwen3Config, Qwen3ForCausalLM),
        seed=11,
        init=dict(embed_std=0.15, final_norm=4.0, gain=1.5),
        min_distinct=6,
        cfg=dict(
            hidden_size=64, intermediate_size=64, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            vocab_size=384, tie_word_embeddings=False, rms_norm_eps=1e-6,
            rope_theta=1000000.0, max_position_embeddings=4096,
        ),
    ),
    # Llama: GQA 4:1, tied embeddings, 7 layers so that the default taps of a 3-layer
    # drafter hit a .5 in build_target_layer_ids (1, 2.5, 4). Scaled so that greedy output
    # runs a token for a while and then switches: drafts are accepted for several tokens
    # and rejected at the switches.
    "llama": dict(
        cls=(LlamaConfig, LlamaForCausalLM),
        seed=12,
        init=dict(embed_std=0.3, final_norm=2.0, gain=1.0),
        min_distinct=2,
        cfg=dict(
            hidden_size=64, intermediate_size=64, num_hidden_layers=7,
            num_attention_heads=4, num_key_value_heads=1, head_dim=16,
            vocab_size=320, tie_word_embeddings=True, rms_norm_eps=1e-5,
            rope_theta=500000.0, max_position_embeddings=4096,
        ),
    ),
    # Qwen2: q/k/v biases, hidden 96 (3 heads of 32, GQA 3:1), tied embeddings; runs and
    # switches like the Llama target.
    "qwen2": dict(
        cls=(Qwen2Config, Qwen2ForCausalLM),
        seed=13,
        init=dict(embed_std=0.3, final_norm=2.0, gain=1.0),
        min_distinct=2,
        cfg=dict(
            hidden_size=96, intermediate_size=64, num_hidden_layers=3,
            num_attention_heads=3, num_key_value_heads=1, head_dim=32,
            vocab_size=448, tie_word_embeddings=True, rms_norm_eps=1e-6,
            rope_theta=10000.0, max_position_embeddings=4096,
        ),
    ),
}


def scale_init_(model, seed, *, embed_std=0.15, gain=1.5, bias_std=0.3, final_norm=4.0):
    """Re-initialises every parameter with a seeded generator, scaled so that logits have
    margins (the default std 0.02 gives near-uniform logits) and greedy output is not one
    repeated token (a small embedding against gain-1.5 layers, the final norm weights
    around 4)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
                if name == "model.norm.weight":
                    p.mul_(final_norm)
            elif name.endswith(".bias"):
                p.copy_(bias_std * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name or name.startswith("lm_head"):
                p.copy_(embed_std * torch.randn(p.shape, generator=g))
            elif p.dim() == 2:
                p.copy_(gain / math.sqrt(p.shape[1]) * torch.randn(p.shape, generator=g))
            else:
                raise ValueError(f"unhandled parameter {name} {tuple(p.shape)}")


def write_word_tokenizer(path, vocab_size):
    """A word-level tokenizer.json over "<0>".."<V-1>" (only so that our loader, which
    requires a tokenizer.json, opens the folder)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"<{i}>": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(path)


def make_target(name, out_dir):
    spec = TARGETS[name]
    cfg_cls, model_cls = spec["cls"]
    cfg = cfg_cls(**spec["cfg"])
    cfg.bos_token_id = None
    cfg.eos_token_id = None
    cfg.pad_token_id = None
    torch.manual_seed(spec["seed"])
    model = model_cls(cfg)
    scale_init_(model, spec["seed"], **spec["init"])
    if cfg.tie_word_embeddings:
        model.tie_weights()
    path = os.path.join(out_dir, "targets", name)
    model.save_pretrained(path)
    write_word_tokenizer(os.path.join(path, "tokenizer.json"), cfg.vocab_size)
    return path


def load_target(path):
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(DEVICE).eval()
    m.requires_grad_(False)
    return m


# ---------------------------------------------------------------------------------------
# Drafters (cases)
# ---------------------------------------------------------------------------------------

CASES = [
    dict(
        # Full layers, block 16, explicit taps: 3 ids for 2 layers, the last one the
        # target's LAST layer (3 of 4), where the reference's tap is the final-normed state.
        name="qwen3_dflash_b16",
        target="qwen3",
        cls=DFlashDraftModel,
        seed=101,
        layers=2,
        intermediate=64,
        rope_theta=1000000.0,
        top=dict(block_size=16, num_target_layers=4),
        dflash=dict(mask_token_id=383, target_layer_ids=[0, 2, 3]),
        train_steps=100,
        gen_blocks=[16, 4],
        save="direct",
    ),
    dict(
        # Sliding layers (window 4) around a full one, block 4, explicit taps.
        name="qwen3_sliding_b4",
        target="qwen3",
        cls=DFlashDraftModel,
        seed=102,
        layers=3,
        intermediate=32,
        rope_theta=10000.0,
        extra=dict(
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            use_sliding_window=True,
            sliding_window=4,
        ),
        top=dict(num_target_layers=4),
        dflash=dict(block_size=4, mask_token_id=7, target_layer_ids=[1, 2]),
        train_steps=100,
        gen_blocks=[4, 8],
        save="direct",
    ),
    dict(
        # Default taps (no target_layer_ids): 3 layers over 7 -> round(2.5) in Python.
        name="llama_default_ids_b16",
        target="llama",
        cls=DFlashDraftModel,
        seed=103,
        layers=3,
        intermediate=32,
        rope_theta=500000.0,
        top=dict(block_size=16, num_target_layers=7),
        dflash=dict(mask_token_id=319),
        train_steps=200,
        gen_blocks=[16],
        save="direct",
    ),
    dict(
        # Plain DFlash with the optional scale/multiplier/soft-cap fields (top level),
        # one layer (default taps [N // 2]), block 4.
        name="llama_scaled_b4",
        target="llama",
        cls=DFlashDraftModel,
        seed=104,
        layers=1,
        intermediate=64,
        rope_theta=500000.0,
        top=dict(
            block_size=4, num_target_layers=7,
            input_embedding_scale=1.5, output_multiplier=0.75, final_logit_softcapping=4.0,
        ),
        dflash=dict(mask_token_id=0),
        train_steps=200,
        gen_blocks=[4],
        save="direct",
    ),
    dict(
        # DFlash2: convolutions (2 taps, groups of 16) and the selector (rank 32, top 8),
        # block 8. Saved by save_pretrained on the constructed model: the codebooks are
        # written as `candidate_selector.{predecessor,successor}_codebook.weight`.
        name="qwen2_dflash2_b8",
        target="qwen2",
        cls=DFlash2DraftModel,
        seed=105,
        layers=2,
        intermediate=32,
        rope_theta=10000.0,
        top=dict(num_target_layers=3),
        dflash=dict(
            block_size=8, mask_token_id=447, target_layer_ids=[0, 1],
            conv_kernel_size=2, conv_group_size=16, selector_rank=32, selector_top_k=8,
        ),
        train_steps=200,
        gen_blocks=[8],
        save="direct",
    ),
    dict(
        # DFlash2 with the optional fields set in dflash_config, 3 conv taps in groups of
        # 32, top 16, block 4. Saved after a from_pretrained round trip, which writes the
        # codebooks as the published checkpoints name them (no `.weight`).
        name="qwen2_dflash2_scaled_b4",
        target="qwen2",
        cls=DFlash2DraftModel,
        seed=106,
        layers=1,
        intermediate=64,
        rope_theta=10000.0,
        top=dict(num_target_layers=3),
        dflash=dict(
            block_size=4, mask_token_id=200, target_layer_ids=[1],
            conv_kernel_size=3, conv_group_size=32, selector_rank=32, selector_top_k=16,
            input_embedding_scale=0.8, output_multiplier=1.25, final_logit_softcapping=5.0,
        ),
        train_steps=200,
        gen_blocks=[4],
        save="roundtrip",
    ),
]


def drafter_config(case, target_cfg):
    fields = dict(
        hidden_size=target_cfg.hidden_size,
        intermediate_size=case["intermediate"],
        num_hidden_layers=case["layers"],
        # hidden 96: 2 heads of 32, so q_proj is [64, 96] (heads * head_dim != hidden).
        num_attention_heads=4 if target_cfg.hidden_size == 64 else 2,
        num_key_value_heads=2 if target_cfg.hidden_size == 64 else 1,
        head_dim=16 if target_cfg.hidden_size == 64 else 32,
        vocab_size=target_cfg.vocab_size,
        rms_norm_eps=1e-6,
        rope_theta=case["rope_theta"],
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    fields.update(case.get("extra", {}))
    fields.update(case["top"])
    cfg = Qwen3Config(**fields, dflash_config=dict(case["dflash"]))
    return cfg


def init_drafter_(model, seed):
    """Seeded, scaled initial weights for every drafter parameter (DFlash2's
    `base_kernel` is torch.empty in the reference and never initialised by it)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("base_kernel"):
                # [2, taps, H]: tap 0 near identity, later taps small.
                v = 0.3 * torch.randn(p.shape, generator=g)
                v[:, 0, :] += 1.0
                p.copy_(v)
            elif "kernel_projection" in name:
                p.copy_(0.3 / math.sqrt(p.shape[1]) * torch.randn(p.shape, generator=g))
            elif "codebook" in name:
                p.copy_(0.6 * torch.randn(p.shape, generator=g))
            elif p.dim() == 2:
                p.copy_(1.0 / math.sqrt(p.shape[1]) * torch.randn(p.shape, generator=g))
            else:
                raise ValueError(f"unhandled parameter {name} {tuple(p.shape)}")


@torch.no_grad()
def greedy(target, prompt, n):
    """Plain greedy decoding (full recompute each step) with each step's top-2 margin."""
    ids = list(prompt)
    margins = []
    for _ in range(n):
        logits = target(torch.tensor([ids])).logits[0, -1]
        top = torch.topk(logits, 2).values
        margins.append(float(top[0] - top[1]))
        ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):], margins


def train_drafter(model, target, seqs, block, steps, seed, lr=3e-3, anchors_per_step=4):
    """Self-distillation with the reference's own forward: `seqs` are (prompt + the
    target's greedy continuation, index of the prompt's last token); an anchor is any
    position from that index on, context = taps of the rows before the anchor, block =
    [token at anchor, MASK...], labels = the sequence's next tokens."""
    rng = np.random.RandomState(seed)
    with torch.no_grad():
        feats = [
            extract_context_feature(
                target(torch.tensor([s]), output_hidden_states=True).hidden_states,
                model.target_layer_ids,
            )
            for s, _ in seqs
        ]
    scale = float(_draft_value(model.config, "input_embedding_scale", 1.0))
    head = _output_head(target)
    gamma = {4: 3.0, 8: 4.0}.get(block, 7.0)
    weights = torch.exp(-torch.arange(block - 1, dtype=torch.float32) / gamma)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    model.train()
    for _ in range(steps):
        loss = 0.0
        for _ in range(anchors_per_step):
            i = rng.randint(len(seqs))
            s, first = seqs[i]
            a = rng.randint(first, len(s) - block + 1)
            blk = torch.full((1, block), model.mask_token_id, dtype=torch.long)
            blk[0, 0] = s[a]
            noise = _raw_input_embeddings(target, blk, scale)
            h = model(
                target_hidden=feats[i][:, :a],
                noise_embedding=noise,
                position_ids=torch.arange(a + block)[None],
            )[:, 1:]
            logits = model.compute_logits(h, head)[0]
            labels = torch.tensor(s[a + 1 : a + block])
            ce = F.cross_entropy(logits, labels, reduction="none")
            loss = loss + (ce * weights).sum() / weights.sum()
        opt.zero_grad()
        (loss / anchors_per_step).backward()
        opt.step()
        sched.step()
    model.eval()
    return float(loss.detach()) / anchors_per_step


def prompts_for(model, target, block, seed, min_distinct, min_margin=0.25, tries=150,
                good=40):
    """Three seeded random prompts (6, 11 and 17 tokens, never the mask token). A prompt
    qualifies when its greedy continuation of MAX_NEW_TOKENS has every top-2 margin >=
    min_margin and at least `min_distinct` distinct tokens; among the first `good`
    qualifying ones (of at most `tries`) the one whose dflash_generate run at `block` has
    the most steps that accept a draft is kept (ties: the first), so that the fixtures
    exercise partial acceptance; the largest smallest margin if none qualifies."""
    rng = np.random.RandomState(seed)
    vocab = target.config.vocab_size
    out = []
    for n in (6, 11, 17):
        best, fallback, seen = None, None, 0
        for _ in range(tries):
            p = []
            while len(p) < n:
                t = int(rng.randint(vocab))
                if t != model.mask_token_id:
                    p.append(t)
            cont, margins = greedy(target, p, MAX_NEW_TOKENS)
            score = min(margins) if len(set(cont)) >= min_distinct else -1.0
            if fallback is None or score > fallback[0]:
                fallback = (score, p)
            if score < min_margin:
                continue
            acc = run_generate(model, target, p, block)["acceptance_lengths"]
            key = (sum(a > 1 for a in acc), -len(acc))
            if best is None or key > best[0]:
                best = (key, p)
            seen += 1
            if seen >= good:
                break
        out.append(best[1] if best is not None else fallback[1])
    return out


def top2_margins(logits):
    top = torch.topk(logits, 2, dim=-1).values
    return (top[..., 0] - top[..., 1]).tolist()


@torch.no_grad()
def block_reference(model, target, prompt):
    """The reference's pieces for one block right after `prompt` (no cache: the same
    computation as dflash_generate's first draft step)."""
    arrays, info = {}, {}
    P = len(prompt)
    ids = torch.tensor([prompt])
    out = target(ids, output_hidden_states=True)
    logits = out.logits[0]  # [P, V]
    arrays["target_logits"] = logits
    info["target_logits_margin"] = top2_margins(logits)
    taps = extract_context_feature(out.hidden_states, model.target_layer_ids)  # [1, P, n*H]
    arrays["taps"] = taps[0]
    # Every target layer's output as transformers reports it (hidden_states[1:]); the last
    # one is after the final norm.
    arrays["target_hidden_states"] = torch.stack(out.hidden_states, 0)[:, 0]
    anchor = int(torch.argmax(logits[-1]))
    info["anchor"] = anchor
    B = model.block_size
    blk = torch.full((1, B), model.mask_token_id, dtype=torch.long)
    blk[0, 0] = anchor
    info["block_ids"] = blk[0].tolist()
    info["block_positions"] = list(range(P, P + B))
    scale = float(_draft_value(model.config, "input_embedding_scale", 1.0))
    noise = _raw_input_embeddings(target, blk, scale)
    arrays["block_embeds"] = noise[0]
    arrays["context"] = model.hidden_norm(model.fc(taps))[0]  # [P, H]

    # Capture each layer's output and DFlash2's convolution stages.
    layer_outs = []
    hooks = [l.register_forward_hook(lambda m, i, o: layer_outs.append(o.detach().clone()))
             for l in model.layers]
    conv_log = []
    patched = []
    if isinstance(model, DFlash2DraftModel):
        for li, layer in enumerate(model.layers):
            for kind in ("attention_conv", "mlp_conv"):
                conv = getattr(layer, kind)
                orig_prepare, orig_finish = conv.prepare, conv.finish

                def prepare(hidden, _o=orig_prepare, _li=li, _k=kind, _c=conv):
                    out_, dyn = _o(hidden)
                    conv_log.append((_li, _k, "in", hidden.detach().clone()))
                    conv_log.append((_li, _k, "kernel", _c.kernel_projection(hidden).detach().clone()))
                    conv_log.append((_li, _k, "prepared", out_.detach().clone()))
                    return out_, dyn

                def finish(hidden, dyn, _o=orig_finish, _li=li, _k=kind):
                    out_ = _o(hidden, dyn)
                    conv_log.append((_li, _k, "sublayer_out", hidden.detach().clone()))
                    conv_log.append((_li, _k, "finished", out_.detach().clone()))
                    return out_

                conv.prepare, conv.finish = prepare, finish
                patched.append(conv)
    hidden = model(
        target_hidden=taps,
        noise_embedding=noise,
        position_ids=torch.arange(P + B)[None],
    )
    for h in hooks:
        h.remove()
    for conv in patched:
        del conv.prepare, conv.finish
    arrays["block_hidden"] = hidden[0]  # [B, H], after the drafter's final norm
    arrays["layer_outputs"] = torch.stack([o[0] for o in layer_outs], 0)  # [L, B, H]
    for li, kind, stage, t in conv_log:
        arrays[f"conv.{li}.{kind}.{stage}"] = t[0]
    dl = model.compute_logits(hidden[:, 1:], _output_head(target))[0]  # [B-1, V]
    arrays["draft_logits"] = dl
    info["draft_logits_margin"] = top2_margins(dl)
    info["draft_argmax"] = torch.argmax(dl, -1).tolist()
    if isinstance(model, DFlash2DraftModel):
        sel = model.candidate_selector
        path, cand, _ = model.propose(hidden[:, 1:], blk[:, 0], _output_head(target), 0.0)
        info["selected_path"] = path[0].tolist()
        # Candidates sorted by (logit desc, id asc) with the selector's scores along the path.
        hp = sel.hidden_projection(hidden[:, 1:])[0]  # [B-1, rank]
        arrays["selector_hidden_projection"] = hp
        pred = blk[0, 0]
        c_ids, c_unary, c_scores, s_margin = [], [], [], []
        for pos in range(B - 1):
            row = dl[pos]
            ids_ = cand[0, pos]
            vals = row[ids_]
            order = sorted(range(len(ids_)), key=lambda j: (-float(vals[j]), int(ids_[j])))
            ids_s = ids_[order]
            scores = row[ids_s] + (
                (sel.predecessor_codebook.weight[pred] * hp[pos])[None] *
                sel.successor_codebook.weight[ids_s]
            ).sum(-1)
            c_ids.append(ids_s.tolist())
            c_unary.append(row[ids_s].tolist())
            c_scores.append(scores.tolist())
            top = torch.topk(scores, 2).values
            s_margin.append(float(top[0] - top[1]))
            assert int(ids_s[int(torch.argmax(scores))]) == info["selected_path"][pos]
            pred = path[0, pos]
        arrays["candidate_ids"] = torch.tensor(c_ids, dtype=torch.int32)
        arrays["candidate_unary"] = torch.tensor(c_unary)
        arrays["candidate_scores"] = torch.tensor(c_scores)
        info["selector_score_margin"] = s_margin
        info["selected_differs_from_argmax"] = info["selected_path"] != info["draft_argmax"]
    return arrays, info


def run_generate(model, target, prompt, block, stop=None):
    r = dflash_generate(
        model, target, torch.tensor([prompt]), MAX_NEW_TOKENS, stop,
        temperature=0.0, block_size=block, return_stats=True,
    )
    return dict(
        block_size=block,
        stop_token_ids=stop,
        output=r.output_ids[0, len(prompt):].tolist(),
        acceptance_lengths=[int(a) for a in r.acceptance_lengths],
    )


def make_case(case, out_dir, target_paths, tmp):
    name = case["name"]
    tpath = target_paths[case["target"]]
    target = load_target(tpath)
    tcfg = target.config
    cfg = drafter_config(case, tcfg)
    torch.manual_seed(case["seed"])
    model = case["cls"](cfg)
    init_drafter_(model, case["seed"])
    B = model.block_size

    # Self-distillation data: greedy continuations of seeded random prompts.
    rng = np.random.RandomState(case["seed"])
    seqs = []
    for _ in range(96):
        p = [int(x) for x in rng.randint(tcfg.vocab_size, size=int(rng.randint(5, 12)))]
        cont, _ = greedy(target, p, B + 6)
        seqs.append((p + cont, len(p) - 1))
    t0 = time.time()
    steps = int(os.environ.get("ZLAB_TRAIN_STEPS", case["train_steps"]))  # for quick trials
    loss = train_drafter(model, target, seqs, B, steps, case["seed"])
    print(f"  {name}: trained {steps} steps in {time.time() - t0:.0f}s, last loss {loss:.3f}", flush=True)

    case_dir = os.path.join(out_dir, name)
    ddir = os.path.join(case_dir, "drafter")
    if case["save"] == "direct":
        model.save_pretrained(ddir)
    else:
        tdir = os.path.join(tmp, name)
        model.save_pretrained(tdir)
        case["cls"].from_pretrained(tdir).save_pretrained(ddir)
    # Everything below runs on the folder as written.
    model = case["cls"].from_pretrained(ddir, dtype=torch.float32).eval()
    model.requires_grad_(False)

    prompts = prompts_for(model, target, case["gen_blocks"][0], case["seed"] + 1000,
                          TARGETS[case["target"]]["min_distinct"])
    arrays, block = block_reference(model, target, prompts[-1])
    gens = []
    for blk in case["gen_blocks"]:
        for p in prompts:
            g = run_generate(model, target, p, blk)
            want, margins = greedy(target, p, MAX_NEW_TOKENS)
            g["target_greedy"] = want
            g["target_greedy_margin"] = margins
            g["equals_target_greedy"] = want == g["output"]
            g["prompt_index"] = prompts.index(p)
            gens.append(g)
    # One run with a stop token: a token that first appears in the middle of a greedy
    # output (index 8 or later if any, else 3 or later; prompts 2, 1, 0 in turn).
    stop_run = None
    for lo in (8, 3):
        for pi in (2, 1, 0):
            out = next(g["output"] for g in gens
                       if g["prompt_index"] == pi and g["block_size"] == case["gen_blocks"][0])
            k = next((i for i in range(lo, len(out)) if out[i] not in out[:i]), None)
            if k is not None and stop_run is None:
                stop_run = (pi, k, out[k])
    if stop_run is not None:
        pi, k, tok = stop_run
        g = run_generate(model, target, prompts[pi], case["gen_blocks"][0], stop=[tok])
        g["prompt_index"] = pi
        g["note"] = f"stop token {tok} first appears at new-token index {k}"
        gens.append(g)
    taus = [a for g in gens for a in g["acceptance_lengths"]]
    print(f"  {name}: mean acceptance length {np.mean(taus):.2f} over {len(taus)} steps; "
          f"all equal greedy: {all(g.get('equals_target_greedy', True) for g in gens)}", flush=True)

    info = dict(
        case=name,
        target=os.path.relpath(tpath, case_dir),
        drafter="drafter",
        architecture=type(model).__name__,
        block_size=B,
        mask_token_id=int(model.mask_token_id),
        target_layer_ids=list(model.target_layer_ids),
        layer_types=list(cfg.layer_types),
        sliding_window=cfg.sliding_window,
        input_embedding_scale=float(_draft_value(model.config, "input_embedding_scale", 1.0)),
        output_multiplier=float(_draft_value(model.config, "output_multiplier", 1.0)),
        final_logit_softcapping=_draft_value(model.config, "final_logit_softcapping"),
        prompts=prompts,
        block=dict(prompt_index=2, **block),
        max_new_tokens=MAX_NEW_TOKENS,
        generate=gens,
        arrays={k: dict(shape=list(v.shape), dtype=str(v.dtype).replace("torch.", ""))
                for k, v in sorted(arrays.items())},
    )
    save_file({k: v.contiguous() for k, v in arrays.items()},
              os.path.join(case_dir, "reference.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(case_dir, "reference.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
    return info


def layer_ids_table(out_dir):
    table = [
        dict(num_target_layers=N, num_draft_layers=n, ids=build_target_layer_ids(N, n))
        for N in range(1, 49) for n in range(1, 9)
    ]
    with open(os.path.join(out_dir, "layer_ids.json"), "w") as f:
        json.dump(dict(
            note="dflash.model.build_target_layer_ids(N, n): n == 1 -> [N // 2]; else "
                 "round(1 + i * (N - 4) / (n - 1)) with Python's round (half to even). "
                 "Small N gives ids below 1 or negative, recorded as returned.",
            table=table), f)
        f.write("\n")


def sampling_fixture(out_dir):
    """_sampling_probs on fixed logits, and _rejection_sample on fixed inputs with the
    uniforms it draws (same seed), its accepted count and the residual it samples from."""
    g = torch.Generator().manual_seed(7)
    logits = 2.0 * torch.randn(4, 32, generator=g)
    logits[3, 5] = logits[3, 9]  # a tie
    probs = []
    for (t, p, k) in [(1.0, 1.0, 0), (0.7, 1.0, 0), (1.0, 0.9, 0), (0.8, 0.5, 0),
                      (1.0, 1.0, 5), (0.6, 0.8, 8), (1.3, 0.95, 20), (1.0, 0.3, 3)]:
        probs.append(dict(temperature=t, top_p=p, top_k=k,
                          probs=_sampling_probs(logits, t, p, k).tolist()))
    rej = []
    for case_seed, mode in [(1, "full"), (2, "full"), (3, "full"), (4, "topk"), (5, "topk"),
                            (6, "full_equal")]:
        gg = torch.Generator().manual_seed(100 + case_seed)
        gamma, V = 5, 24
        tp = torch.softmax(1.5 * torch.randn(1, gamma + 1, V, generator=gg), -1)
        dl = 1.5 * torch.randn(1, gamma, V, generator=gg)
        if mode.startswith("full"):
            dp = torch.softmax(dl, -1)
            if mode == "full_equal":  # p == q on the drafted rows: every draft accepted
                tp[:, :gamma] = dp
            # draft tokens sampled from q (seeded)
            toks = torch.multinomial(dp[0], 1, generator=gg).T
            idx = None
        else:
            K = 6
            sc, idx = torch.topk(dl, K, -1)
            dp = torch.softmax(sc, -1)
            pick = torch.multinomial(dp[0], 1, generator=gg)[:, 0]
            toks = idx[0].gather(-1, pick[:, None]).T
        torch.manual_seed(1000 + case_seed)
        p = tp[:, :gamma].gather(-1, toks[..., None])[..., 0]
        u = torch.rand_like(p)
        torch.manual_seed(1000 + case_seed)
        acc, bonus = _rejection_sample(toks, tp, dp, idx)
        q = dp.gather(-1, toks[..., None])[..., 0] if idx is None else (
            dp * (idx == toks[..., None])).sum(-1)
        assert acc == int((u * q < p).to(torch.int32).cumprod(-1).sum()), "uniforms differ"
        if acc < gamma:
            res = tp[0, acc].clone()
            if idx is None:
                res -= dp[0, acc]
            else:
                res.scatter_add_(0, idx[0, acc], -dp[0, acc])
            res = res.clamp_min(0)
            res = res / res.sum() if res.sum() > 0 else tp[0, acc]
        else:
            res = tp[0, gamma]
        assert float(res[int(bonus)]) > 0
        rej.append(dict(
            mode=mode, draft_tokens=toks[0].tolist(), target_probs=tp[0].tolist(),
            draft_probs=dp[0].tolist(), draft_indices=None if idx is None else idx[0].tolist(),
            uniforms=u[0].tolist(), accepted=int(acc), bonus_distribution=res.tolist(),
            bonus_sampled=int(bonus),
        ))
    with open(os.path.join(out_dir, "sampling.json"), "w") as f:
        json.dump(dict(logits=logits.tolist(), sampling_probs=probs, rejection=rej), f)
        f.write("\n")


README_HEAD = """# z-lab reference fixtures

Outputs of z-lab's own DFlash/DFlash2 implementation (PyPI `dflash==0.1.0`,
`dflash/model.py`) on tiny random models, for the conformance tests of issue 21. Written
by `scripts/make_zlab_fixtures.py` (run by hand, never by CI; everything below is
regenerated by it, this file included):

    python3 -m venv /tmp/zvenv
    /tmp/zvenv/bin/pip install torch==2.11.0 transformers==5.17.0 gguf accelerate safetensors numpy
    /tmp/zvenv/bin/pip install --no-deps dflash==0.1.0
    /tmp/zvenv/bin/python scripts/make_zlab_fixtures.py fixtures/zlab

Versions: {versions}. CPU, float32, seeded.

Every float is float32 and every weight file is float32 safetensors. Token ids only: the
`tokenizer.json` of each target is a word-level vocabulary "<0>".."<V-1>" added only because
our Hugging Face loader requires one; nothing here tokenizes text.

## Targets (`targets/<name>/`)

Built with transformers' own classes, weights re-initialised with a seeded generator and
scaled (the default init gives near-uniform logits), saved with `save_pretrained`:
`config.json`, `generation_config.json`, `model.safetensors` (float32; tied models have no
`lm_head.weight`), plus `tokenizer.json`. No bos/eos ids (so nothing stops early).

| target | class | hidden | layers | heads / kv / head_dim | ffn | vocab | tied | extras |
|---|---|---|---|---|---|---|---|---|
{targets}

## Cases (`<case>/`)

Each case is a drafter made by the reference's own class, its weights seeded and scaled,
then briefly self-distilled on the target's greedy output with the reference's own forward
(so drafts are neither constant nor always wrong), saved with `save_pretrained` and loaded
back from the folder for every output below.

| case | target | class | layers (types) | block | mask id | target_layer_ids | notes |
|---|---|---|---|---|---|---|---|
{cases}

Files of a case:
- `drafter/config.json`, `drafter/model.safetensors`: the drafter as the reference wrote it.
- `reference.json`: metadata, prompts, small integer/float lists (below).
- `reference.safetensors`: the float arrays (below).

### `reference.json`
- `case`, `target` (path of the target folder relative to the case folder), `drafter`,
  `architecture`, `block_size`, `mask_token_id`, `target_layer_ids` (as the reference
  resolved them: explicit, or `build_target_layer_ids`), `layer_types`, `sliding_window`,
  `input_embedding_scale`, `output_multiplier`, `final_logit_softcapping` (as
  `_draft_value` reads them: `dflash_config` first, then the top level; 1.0 / 1.0 / null when
  absent).
- `prompts`: three prompts of token ids (6, 11 and 17 tokens).
- `block`: one draft block right after prompt `prompt_index` (2), computed without a cache
  exactly as `dflash_generate`'s first draft step: `anchor` (argmax of the target's last
  prompt row), `block_ids` (`[anchor, mask x (B-1)]`), `block_positions` (P..P+B-1),
  `target_logits_margin` (top-2 gap of every prompt row), `draft_argmax` and
  `draft_logits_margin` (per slot 1..B-1 of `draft_logits`). DFlash2 also: `selected_path`
  (the selector's greedy walk, `propose(..., temperature=0)`), `selector_score_margin`
  (top-2 gap of `candidate_scores` per slot), `selected_differs_from_argmax`.
- `max_new_tokens` (24) and `generate`: runs of `dflash_generate(..., temperature=0,
  block_size=..., return_stats=True)`, each with `prompt_index`, `block_size`,
  `stop_token_ids` (null, or one id for the stop run), `output` (the new tokens: prompt
  excluded), `acceptance_lengths` (the reference's `acceptance_lengths`, see below), and,
  except for the stop run, `target_greedy` (plain greedy decoding of the target, full
  recompute), `target_greedy_margin` (its top-2 gap per step) and `equals_target_greedy`.
- `arrays`: name -> shape and dtype of every array in `reference.safetensors`.

### `reference.safetensors` (P prompt rows, B block, H hidden, V vocab, L draft layers)
- `target_logits` [P, V]: the target's logits for every prompt row.
- `target_hidden_states` [N+1, P, H]: transformers' `output_hidden_states`: [0] the
  embeddings, [i+1] the output of target layer i, EXCEPT the last entry, which is after the
  target's final norm (see below).
- `taps` [P, n_ids*H]: `extract_context_feature(hidden_states, target_layer_ids)`, the
  entries `hidden_states[id + 1]` concatenated in id order.
- `context` [P, H]: `hidden_norm(fc(taps))`, the rows the draft layers take K/V from.
- `block_embeds` [B, H]: the target's embedding rows of `block_ids` times
  `input_embedding_scale`.
- `layer_outputs` [L, B, H]: the residual stream after each draft layer.
- `block_hidden` [B, H]: after the drafter's final norm, all B rows (slot 0 included).
- `draft_logits` [B-1, V]: `compute_logits(block_hidden[1:], target lm_head)`: times
  `output_multiplier`, then `tanh(x / cap) * cap` when `final_logit_softcapping` > 0.
- DFlash2 only, for layer l and conv c in {{attention_conv, mlp_conv}}:
  `conv.l.c.in` [B, H] (the sublayer's input after its RMSNorm), `conv.l.c.kernel`
  [B, 2*taps*groups] (`kernel_projection(in)`, viewed as [2, taps, groups]: side 0 before
  the sublayer, side 1 after), `conv.l.c.prepared` [B, H] (side 0 applied to `in`: what
  the sublayer sees), `conv.l.c.sublayer_out` [B, H] (attention after o_proj, or the MLP
  output), `conv.l.c.finished` [B, H] (side 1 applied to `sublayer_out`: what is added to
  the residual). `selector_hidden_projection` [B-1, rank]; `candidate_ids` [B-1, K] int32
  (each slot's top-K of `draft_logits`, sorted by logit descending then id ascending; the
  reference's own order is `topk(sorted=False)`), `candidate_unary` [B-1, K] (their
  `draft_logits`), `candidate_scores` [B-1, K] (`unary + sum_r A[pred, r] * hp[r] *
  B[c, r]`, pred = the path's previous token, the anchor for slot 1).

## `layer_ids.json`
`table`: `build_target_layer_ids(N, n)` for N in 1..48 target layers and n in 1..8 draft
layers, as returned (Python's `round`, half to even; negative or repeated ids for small N).

## `sampling.json`
- `logits` [4, 32] and `sampling_probs`: `_sampling_probs(logits, temperature, top_p, top_k)`
  for 8 settings (row 3 holds a tie at ids 5 and 9).
- `rejection`: 6 calls of `_rejection_sample(draft_tokens, target_probs, draft_probs,
  draft_indices)` with gamma 5 over a vocabulary of 24: `mode` "full" (q over the
  vocabulary, `draft_indices` null), "full_equal" (the same with p == q on the drafted
  rows, so every draft is accepted) or "topk" (q over 6 candidates, `draft_indices` their
  ids: DFlash2's form), `target_probs` [6, 24], `draft_probs` [5, 24] or [5, 6],
  `draft_tokens` [5], `uniforms` [5] (the `torch.rand_like` values it drew: draft j is
  accepted iff u_j * q_j < p_j, and acceptance stops at the first rejection), `accepted`,
  `bonus_distribution` [24] (normalised max(0, p - q) at the first rejection, or p of the
  last row when all are accepted) and `bonus_sampled` (the token it drew from it).

## Reference behaviour worth knowing
- `acceptance_lengths`: one entry per verify step = tokens committed in that step (the
  anchor plus the accepted drafts), capped at `max_length - start - 1` (the last block is
  also shortened to `min(block, max_length - start)` rows) and cut after a stop token. The
  final bonus token is never counted: new tokens = 1 + sum(acceptance_lengths). The output
  includes the stop token.
- Taps: `hidden_states[id + 1]`; in transformers 5 the last entry of `hidden_states` is
  the final-normed state, so a tap of the target's LAST layer (case `qwen3_dflash_b16`,
  id 3 of 4) is `norm(residual)`, not the residual.
- Sliding draft layers: causal inside the block by default (`is_causal` in the config
  overrides it for every layer, full ones too) and a per-query window: block row i sees
  keys at positions p with `q - p < sliding_window` (itself included, so W-1 context rows
  for slot 0) and, only when not causal, also `p - q < sliding_window`. Full layers: no
  mask at all. Needs `use_sliding_window: true`, else transformers' Qwen3Config drops
  `sliding_window` to null (the layer is then causal without a window, and
  `dflash_generate` fails building its cache).
- `input_embedding_scale`, `output_multiplier`, `final_logit_softcapping` apply to plain
  DFlash drafters too (case `llama_scaled_b4`), read from `dflash_config` or the top level.
- DFlash2 codebooks: `save_pretrained` of a constructed `DFlash2DraftModel` writes
  `candidate_selector.{{predecessor,successor}}_codebook.weight` (case
  `qwen2_dflash2_b8`); a model loaded with `from_pretrained` (which maps the published
  names) writes them back without `.weight` (case `qwen2_dflash2_scaled_b4`). Both load in
  the reference.
- Default taps: `build_target_layer_ids` rounds with Python's `round` (half to even):
  7 target layers and 3 draft layers give [1, 2, 4] (case `llama_default_ids_b16`), where
  rounding half away from zero gives [1, 3, 4]; `layer_ids.json` has the whole grid.
- The reference's draft cache keeps only the last `sliding_window - 1` context rows on a
  sliding layer (transformers' `DynamicSlidingWindowLayer`, cropped after each step), all
  the rows a block query can see.
- A freshly constructed `DFlash2DraftModel` leaves `base_kernel` uninitialised
  (`torch.empty`; its `_init_weights` does not touch it): the generator sets every weight
  itself.
- DFlash2 at T > 0 samples each slot from softmax(scores / T) over its K candidates only
  (top_p / top_k are not applied to drafts), and verifies with `_rejection_sample` using
  the candidate ids as `draft_indices`.

## Files
| file | bytes |
|---|---|
{files}
"""


def write_readme(out_dir, infos):
    rows = []
    for name, spec in TARGETS.items():
        c = spec["cfg"]
        cls = spec["cls"][1].__name__
        extras = {"qwen3": "q/k norms", "llama": "", "qwen2": "q/k/v biases"}[name]
        extras += f"{'; ' if extras else ''}rope_theta {c['rope_theta']:g}, eps {c['rms_norm_eps']:g}"
        rows.append(
            f"| `{name}` | {cls} | {c['hidden_size']} | {c['num_hidden_layers']} | "
            f"{c['num_attention_heads']} / {c['num_key_value_heads']} / {c['head_dim']} | "
            f"{c['intermediate_size']} | {c['vocab_size']} | {c['tie_word_embeddings']} | {extras} |")
    case_rows = []
    for case, info in zip([c for c in CASES if c["name"] in {i["case"] for i in infos}], infos):
        given = "target_layer_ids" in case["dflash"]
        kinds = ", ".join("S" if t == "sliding_attention" else "F" for t in info["layer_types"])
        notes = []
        if info["sliding_window"]:
            notes.append(f"sliding_window {info['sliding_window']}")
        d2 = {k: v for k, v in case["dflash"].items() if k.startswith(("conv", "selector"))}
        if d2:
            notes.append(", ".join(f"{k} {v}" for k, v in d2.items()))
        for k in ("input_embedding_scale", "output_multiplier", "final_logit_softcapping"):
            where = "dflash_config" if k in case["dflash"] else "top level" if k in case["top"] else None
            if where:
                notes.append(f"{k} {info[k]} ({where})")
        notes.append("block_size in " + ("dflash_config" if "block_size" in case["dflash"] else "top level"))
        notes.append(f"generate at blocks {case['gen_blocks']}")
        if case["cls"] is DFlash2DraftModel:
            notes.append("codebooks saved " + ("with `.weight`" if case["save"] == "direct" else "without `.weight` (round trip)"))
        case_rows.append(
            f"| `{info['case']}` | `{case['target']}` | {info['architecture']} | {case['layers']} ({kinds}) | "
            f"{info['block_size']} | {info['mask_token_id']} | {info['target_layer_ids']} "
            f"({'explicit' if given else 'default'}) | {'; '.join(notes)} |")
    files = []
    for d, _, fs in sorted(os.walk(out_dir)):
        for f in sorted(fs):
            pth = os.path.join(d, f)
            files.append(f"| `{os.path.relpath(pth, out_dir)}` | {os.path.getsize(pth)} |")
    versions = (f"Python {sys.version.split()[0]}, torch {torch.__version__}, transformers "
                f"{transformers.__version__}, dflash 0.1.0, safetensors {safetensors.__version__}, numpy {np.__version__}")
    text = README_HEAD.format(versions=versions, targets="\n".join(rows),
                              cases="\n".join(case_rows), files="\n".join(files))
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(text)


def main(out_dir):
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"dflash {getattr(dm, '__version__', '0.1.0')}", flush=True)
    target_paths = {n: make_target(n, out_dir) for n in TARGETS}
    infos = []
    with tempfile.TemporaryDirectory() as tmp:
        only = os.environ.get("ZLAB_ONLY")  # for quick trials: one case by name
        for case in CASES:
            if only and case["name"] != only:
                continue
            infos.append(make_case(case, out_dir, target_paths, tmp))
    layer_ids_table(out_dir)
    sampling_fixture(out_dir)
    write_readme(out_dir, infos)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out_dir) for f in fs)
    print(f"wrote {out_dir}: {total / 1e6:.2f} MB", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fixtures/zlab")
