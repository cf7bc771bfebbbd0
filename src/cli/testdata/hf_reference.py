#!/usr/bin/python3
"""The logits of a Hugging Face model directory, computed independently.

Usage: hf_reference.py MODEL_DIR TOKENS OUT
  MODEL_DIR  holds model.safetensors and config.json (GPT2LMHeadModel,
             LlamaForCausalLM, MistralForCausalLM or GemmaForCausalLM)
  TOKENS     comma-separated token ids: one sequence
  OUT        written: the [T, V] logits as little-endian float64

The reference of export_command_test: the file is read with a loader of its
own (struct + json + torch.frombuffer, not the safetensors package), and the
forward pass is written here from the classes' definitions in Hugging Face's
transformers (modeling_gpt2.py, modeling_llama.py, modeling_mistral.py,
modeling_gemma.py), without importing transformers, in float64 so that the
reference adds no rounding of its own worth speaking of.
"""
import json
import math
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = bytearray(data[base + begin : base + end])
        t = torch.frombuffer(raw, dtype=DTYPES[info["dtype"]])
        tensors[name] = t.reshape(info["shape"]).to(torch.float64)
    return tensors


def causal_attention(q, k, v):
    """q [heads, T, hd], k and v [heads, T, hd]: softmax(q k^T / sqrt(hd)) v."""
    T, hd = q.shape[1], q.shape[2]
    scores = q @ k.transpose(1, 2) / math.sqrt(hd)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def gelu_tanh(x):  # gelu_new / gelu_pytorch_tanh
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def gpt2_logits(cfg, w, ids):
    """GPT2LMHeadModel: pre-LayerNorm blocks, Conv1D weights [in, out]."""
    p = "transformer." if "transformer.wte.weight" in w else ""
    C, heads = cfg["n_embd"], cfg["n_head"]
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    T = len(ids)

    def ln(x, name):
        return torch.nn.functional.layer_norm(
            x, (C,), w[name + ".weight"], w[name + ".bias"], eps
        )

    def conv1d(x, name):
        return x @ w[name + ".weight"] + w[name + ".bias"]

    h = w[p + "wte.weight"][ids] + w[p + "wpe.weight"][torch.arange(T)]
    for i in range(cfg["n_layer"]):
        b = f"{p}h.{i}."
        q, k, v = conv1d(ln(h, b + "ln_1"), b + "attn.c_attn").split(C, dim=-1)
        split = lambda t: t.reshape(T, heads, C // heads).transpose(0, 1)
        y = causal_attention(split(q), split(k), split(v))
        h = h + conv1d(y.transpose(0, 1).reshape(T, C), b + "attn.c_proj")
        m = gelu_tanh(conv1d(ln(h, b + "ln_2"), b + "mlp.c_fc"))
        h = h + conv1d(m, b + "mlp.c_proj")
    h = ln(h, p + "ln_f")
    head = w[p + "wte.weight"] if cfg.get("tie_word_embeddings", True) else w["lm_head.weight"]
    return h @ head.T


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def llama_logits(cfg, w, ids):
    """LlamaForCausalLM, MistralForCausalLM and GemmaForCausalLM."""
    gemma = cfg["model_type"] == "gemma"
    C, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    hd = cfg.get("head_dim") or C // heads
    eps = cfg.get("rms_norm_eps", 1e-6)
    theta = cfg.get("rope_theta", 10000.0)
    if gemma:
        act_name = cfg.get("hidden_activation") or "gelu_pytorch_tanh"
    else:
        act_name = cfg.get("hidden_act", "silu")
    act = torch.nn.functional.silu if act_name == "silu" else gelu_tanh
    T = len(ids)

    def rms_norm(x, name):
        weight = w[name]
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return x * (1.0 + weight) if gemma else x * weight

    def linear(x, name):  # torch Linear: weight [out, in]
        return x @ w[name].T

    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def rope(x):  # [heads, T, hd]
        return x * cos + rotate_half(x) * sin

    h = w["model.embed_tokens.weight"][ids]
    if gemma:
        h = h * math.sqrt(C)
    for i in range(cfg["num_hidden_layers"]):
        b = f"model.layers.{i}."
        x = rms_norm(h, b + "input_layernorm.weight")
        q = linear(x, b + "self_attn.q_proj.weight").reshape(T, heads, hd).transpose(0, 1)
        k = linear(x, b + "self_attn.k_proj.weight").reshape(T, kv_heads, hd).transpose(0, 1)
        v = linear(x, b + "self_attn.v_proj.weight").reshape(T, kv_heads, hd).transpose(0, 1)
        q, k = rope(q), rope(k)
        # repeat_kv: query head j reads key/value head j // (heads / kv_heads).
        k = k.repeat_interleave(heads // kv_heads, dim=0)
        v = v.repeat_interleave(heads // kv_heads, dim=0)
        y = causal_attention(q, k, v).transpose(0, 1).reshape(T, heads * hd)
        h = h + linear(y, b + "self_attn.o_proj.weight")
        x = rms_norm(h, b + "post_attention_layernorm.weight")
        gate = act(linear(x, b + "mlp.gate_proj.weight"))
        up = linear(x, b + "mlp.up_proj.weight")
        h = h + linear(gate * up, b + "mlp.down_proj.weight")
    h = rms_norm(h, "model.norm.weight")
    tied = cfg.get("tie_word_embeddings", gemma)
    head = w["model.embed_tokens.weight"] if tied else w["lm_head.weight"]
    return h @ head.T


def main():
    model_dir, tokens, out = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(model_dir + "/config.json") as f:
        cfg = json.load(f)
    w = load_safetensors(model_dir + "/model.safetensors")
    ids = torch.tensor([int(t) for t in tokens.split(",")])
    if cfg["model_type"] == "gpt2":
        logits = gpt2_logits(cfg, w, ids)
    elif cfg["model_type"] in ("llama", "mistral", "gemma"):
        logits = llama_logits(cfg, w, ids)
    else:
        sys.exit("hf_reference.py: model_type %s is not implemented" % cfg["model_type"])
    with open(out, "wb") as f:
        f.write(struct.pack("<%dd" % logits.numel(), *logits.flatten().tolist()))


if __name__ == "__main__":
    main()
