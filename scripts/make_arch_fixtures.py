#!/usr/bin/env python3
"""Makes the architecture fixtures in fixtures/arch/ (run by hand, never by CI).

Each case is a tiny random model built with transformers' own classes, saved with
`save_pretrained` (float32), and the logits transformers computes for it: the oracle for
the CPU reference of an architecture the engine added after the z-lab fixtures
(fixtures/zlab/ covers llama, qwen2 and qwen3). Versions used for the committed files:

    Python 3.11, torch 2.11.0 (PyPI's CUDA build, run on the CPU), transformers 5.17.0,
    tokenizers 0.23, safetensors 0.8, numpy 2.4

    python3 -m venv /tmp/zvenv
    /tmp/zvenv/bin/pip install torch==2.11.0 transformers==5.17.0 safetensors numpy
    /tmp/zvenv/bin/python scripts/make_arch_fixtures.py fixtures/arch

What it writes, per case (`qwen3_moe`, `qwen3_5`, `qwen3_5_moe`):
  <case>/model/: config.json, generation_config.json, model.safetensors (float32, the
      checkpoint layout transformers writes: one tensor per expert), and a word-level
      tokenizer.json over "<0>".."<V-1>" (our Hugging Face loader requires one; the
      fixtures use token ids only).
  <case>/reference.json: `ids` (a seeded sequence), `logits` (transformers' float32
      logits at every position, [len(ids), vocab]), `prompt` and `greedy` (the greedy
      continuation of the prompt by full recomputation, argmax per step),
      `router_margin` (mixtures only: the smallest gap, over every token and sparse layer, between the
      k-th and (k+1)-th router score: an engine that computes the router in
      another order picks the same experts when this is not tiny).
"""
import json
import math
import os
import shutil
import sys

import torch

CASES = {
    "qwen3_moe": dict(
        cls=("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
        cfg=dict(
            vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            num_experts=8, num_experts_per_tok=3, norm_topk_prob=True, decoder_sparse_step=1,
            mlp_only_layers=[1], max_position_embeddings=512, rms_norm_eps=1e-6,
            tie_word_embeddings=False,
        ),
        # The first seed from 20 whose router margin is over 1e-3.
        seed=20,
    ),
    # Qwen3.5's text model: Gated DeltaNet layers 0, 1, 3 and gated full attention at 2
    # (partial RoPE: a quarter of each head), 2 key heads shared by 4 value heads.
    "qwen3_5": dict(
        cls=("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
        cfg=dict(
            vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4,
            layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25,
                                 mrope_section=[2, 1, 1]),
            max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
        ),
        seed=30,
    ),
    # Qwen3.5-MoE's text model: the qwen3_5 layers with a mixture in every layer (8
    # experts, 3 per token, renormalised) and a shared expert weighed by its gate.
    "qwen3_5_moe": dict(
        cls=("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM"),
        cfg=dict(
            vocab_size=128, hidden_size=64, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4,
            layer_types=["linear_attention", "full_attention", "linear_attention"],
            moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=8,
            num_experts_per_tok=3,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25,
                                 mrope_section=[2, 1, 1]),
            max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
        ),
        # The first seed from 40 whose router margin is over 1e-3.
        seed=40,
    ),
}


def scale_init_(model, seed, gain=1.5, router_gain=2.0, embed_std=0.5):
    """Seeded weights with margins: norms around 1, matrices gain / sqrt(fan_in) (the
    router larger, so that the experts' probabilities are apart), embeddings embed_std."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight") and getattr(model.config, "model_type", "").startswith("qwen3_5") \
                    and "linear_attn" not in name:
                # Zero-centred RMSNorm (the weight is 1 + w).
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("A_log"):
                p.copy_(torch.log(torch.empty(p.shape).uniform_(1.0, 8.0, generator=g)))
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("conv1d.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name or name.startswith("lm_head"):
                p.copy_(embed_std * torch.randn(p.shape, generator=g))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(router_gain / math.sqrt(p.shape[-1]) * torch.randn(p.shape, generator=g))
            elif p.dim() >= 2:
                p.copy_(gain / math.sqrt(p.shape[-1]) * torch.randn(p.shape, generator=g))
            else:
                raise ValueError(f"unhandled parameter {name} {tuple(p.shape)}")


def write_word_tokenizer(path, vocab_size):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"<{i}>": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(path)


def router_margin(model, ids, k):
    """Smallest gap between the k-th and (k+1)-th router score (logit) over every token
    of `ids` and every sparse layer (hooks on the routers' inputs)."""
    gaps = []

    def hook(mod, inp, out):
        h = inp[0].reshape(-1, mod.weight.shape[1])
        top = torch.topk(h @ mod.weight.T, k + 1, dim=-1).values
        gaps.append((top[:, k - 1] - top[:, k]).min().item())

    hooks = [m.register_forward_hook(hook) for n, m in model.named_modules() if n.endswith("mlp.gate")]
    with torch.no_grad():
        model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    return min(gaps) if gaps else None


def make_case(name, out_dir):
    import transformers

    spec = CASES[name]
    cfg_cls, model_cls = (getattr(transformers, c) for c in spec["cls"])
    cfg = cfg_cls(**spec["cfg"])
    cfg.bos_token_id = cfg.eos_token_id = cfg.pad_token_id = None
    torch.manual_seed(spec["seed"])
    model = model_cls(cfg).eval()
    scale_init_(model, spec["seed"])
    case = os.path.join(out_dir, name)
    model.save_pretrained(os.path.join(case, "model"))
    write_word_tokenizer(os.path.join(case, "model", "tokenizer.json"), cfg.vocab_size)
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    ids = torch.randint(0, cfg.vocab_size, (24,), generator=g).tolist()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
        prompt, seq = ids[:8], list(ids[:8])
        for _ in range(16):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    k = getattr(cfg, "num_experts_per_tok", None)
    margin = k and min(router_margin(model, ids, k), router_margin(model, seq, k))
    ref = dict(ids=ids, logits=logits.tolist(), prompt=prompt, greedy=seq[len(prompt):],
               router_margin=margin)
    with open(os.path.join(case, "reference.json"), "w") as f:
        json.dump(ref, f)
    print(f"{name}: router margin {margin}, greedy {ref['greedy']}")


def main(out_dir):
    for name in CASES:
        shutil.rmtree(os.path.join(out_dir, name), ignore_errors=True)
        make_case(name, out_dir)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fixtures/arch")
