#!/usr/bin/python3
"""One Llama-block training step in PyTorch: the peer of train_step_bench
--decoder_block llama2 (or gemma).

The model of `multislice train` with decoder_block llama2 (src/model/
llama_block.h), written here from its definition: a token embedding, pre-RMSNorm
blocks (eps 1e-5) of causal self-attention with grouped key/value heads (one
fused q|k|v projection without biases, rotary embeddings on q and k by rotating
halves, MaxText's timescales) and a SwiGLU MLP (silu(x W_gate) * x W_up, then
W_down), a final RMSNorm and an untied head; mean cross-entropy over the B*T
positions. --block gemma: GeGLU (GPT-2's tanh GELU), a tied head whose logits
are divided by sqrt(C). A step is what `train_step_bench` times: forward,
backward, the gradient's global norm clipped to 1.0, and AdamW (betas 0.9,
0.95, eps 1e-8, weight decay 0.1 on the 2-D weights and embeddings only).
Attention is the explicit q k^T, causal mask, softmax, @ v (PyTorch 1.13 has no
scaled_dot_product_attention); the key/value heads are repeated to the query
heads (repeat_interleave), as Hugging Face's Llama does.

--dtype bfloat16 runs the forward under torch.autocast("cpu", bfloat16): the
matmuls in bf16, master weights, the optimizer and the loss in f32, as
`multislice train` does. PyTorch 1.13 sends bf16 matmuls to oneDNN only on
CPUs with AVX-512 (BW, VL, DQ); on an AVX2-only CPU it uses its own bf16
GEMM. Under the AVX2 cap oneDNN refuses bf16 primitives, so the peer turns
oneDNN off (torch.backends.mkldnn) and takes that same own path, as it would
on an AVX2-only CPU.

One process, torch.set_num_threads(1), OpenBLAS and OpenMP on one thread.
MULTISLICE_MAX_ISA=avx2 (or --isa avx2) caps PyTorch's own kernels
(ATEN_CPU_CAPABILITY=avx2), its oneDNN (DNNL_MAX_CPU_ISA=AVX2) and OpenBLAS
(OPENBLAS_CORETYPE=HASWELL), as pytorch_gpt_step.py does.

Runs with Debian 12's python3-torch (PyTorch 1.13) under /usr/bin/python3.
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_step import import_torch, summary, time_steps  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="One Llama-block training step (forward, backward, "
        "clipping, AdamW) in PyTorch on one thread, the peer of "
        "train_step_bench --decoder_block llama2")
    p.add_argument("--batch", type=int, default=16, help="B, sequences")
    p.add_argument("--seq", type=int, default=64, help="T, tokens each")
    p.add_argument("--emb", type=int, default=384, help="C, channels")
    p.add_argument("--heads", type=int, default=6, help="query heads")
    p.add_argument("--kv_heads", type=int, default=2, help="key/value heads")
    p.add_argument("--head_dim", type=int, default=64)
    p.add_argument("--mlp", type=int, default=1024, help="MLP width")
    p.add_argument("--layers", type=int, default=2, help="L")
    p.add_argument("--vocab", type=int, default=8192, help="V")
    p.add_argument("--block", default="llama2", choices=["llama2", "gemma"])
    p.add_argument("--dtype", default="float32",
                   choices=["float32", "bfloat16"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--isa", default=os.environ.get("MULTISLICE_MAX_ISA", ""),
                   help="avx2: cap PyTorch, its oneDNN and OpenBLAS at AVX2 "
                   "(default: MULTISLICE_MAX_ISA; empty: no cap)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    for name in ("batch", "seq", "emb", "heads", "kv_heads", "head_dim", "mlp",
                 "layers", "vocab", "steps"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be at least 1")
    if a.heads % a.kv_heads:
        p.error("--kv_heads must divide --heads")
    if a.head_dim % 2:
        p.error("--head_dim must be even (rotary embeddings rotate pairs)")
    if a.isa not in ("", "avx2", "x86-64-v3"):
        p.error(f"--isa: '{a.isa}' is not supported by the peer; expected "
                "avx2 or nothing")
    return a


def build_model(torch, a):
    nn = torch.nn
    F = torch.nn.functional
    gemma = a.block == "gemma"
    hd, nh, nkv = a.head_dim, a.heads, a.kv_heads

    class RmsNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(a.emb))

        def forward(self, x):
            x32 = x.float()
            r = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)
            return (x32 * r).to(x.dtype) * self.weight

    # MaxText's rotary table: angle = t / 10000^(2i / hd), pairs (i, i + hd/2).
    i = torch.arange(hd // 2, dtype=torch.float64)
    timescale = 10000.0 ** (2.0 * i / hd)
    angle = torch.arange(a.seq, dtype=torch.float64)[:, None] / timescale
    cos = torch.cat([angle.cos(), angle.cos()], -1).float()
    sin = torch.cat([angle.sin(), angle.sin()], -1).float()

    def rotate(x):  # [B, heads, T, hd]
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        half = torch.cat([-x2, x1], -1)
        return x * cos[:x.shape[-2]].to(x.dtype) + half * sin[:x.shape[-2]].to(
            x.dtype)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm = RmsNorm()
            self.qkv = nn.Linear(a.emb, (nh + 2 * nkv) * hd, bias=False)
            self.proj = nn.Linear(nh * hd, a.emb, bias=False)
            self.mlp_norm = RmsNorm()
            self.gate_up = nn.Linear(a.emb, 2 * a.mlp, bias=False)
            self.down = nn.Linear(a.mlp, a.emb, bias=False)
            mask = torch.tril(torch.ones(a.seq, a.seq, dtype=torch.bool))
            self.register_buffer("mask", mask)

        def attention(self, x):
            B, T, _ = x.shape
            q, k, v = self.qkv(x).split([nh * hd, nkv * hd, nkv * hd], dim=2)
            q = rotate(q.view(B, T, nh, hd).transpose(1, 2))
            k = rotate(k.view(B, T, nkv, hd).transpose(1, 2))
            v = v.view(B, T, nkv, hd).transpose(1, 2)
            k = k.repeat_interleave(nh // nkv, dim=1)
            v = v.repeat_interleave(nh // nkv, dim=1)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
            y = F.softmax(att, dim=-1) @ v
            return self.proj(y.transpose(1, 2).contiguous().view(B, T, nh * hd))

        def forward(self, x):
            x = x + self.attention(self.attn_norm(x))
            gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
            act = (F.gelu(gate, approximate="tanh") if gemma else F.silu(gate))
            return x + self.down(act * up)

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(a.vocab, a.emb)
            self.blocks = nn.ModuleList(Block() for _ in range(a.layers))
            self.norm = RmsNorm()
            self.lm_head = None if gemma else nn.Linear(a.emb, a.vocab,
                                                        bias=False)

        def forward(self, tokens, targets):
            x = self.wte(tokens)
            for block in self.blocks:
                x = block(x)
            x = self.norm(x)
            if gemma:
                logits = F.linear(x, self.wte.weight) / math.sqrt(a.emb)
            else:
                logits = self.lm_head(x)
            return F.cross_entropy(logits.float().view(-1, a.vocab),
                                   targets.view(-1))

    torch.manual_seed(0)
    model = Llama()
    for name, p in model.named_parameters():
        if p.dim() == 2:
            nn.init.normal_(p, std=0.02)
    return model


def main(argv):
    a = parse_args(argv)
    torch, blas = import_torch(a.isa)
    if a.isa and a.dtype == "bfloat16":
        torch.backends.mkldnn.enabled = False  # as on an AVX2-only CPU
    model = build_model(torch, a)
    times, loss = time_steps(torch, model, a, bf16=a.dtype == "bfloat16")
    out = summary(torch, blas, model, a, times, loss)
    out.update({
        "dtype": a.dtype, "mkldnn": torch.backends.mkldnn.enabled,
        "block": a.block, "batch": a.batch, "seq": a.seq, "emb": a.emb,
        "heads": a.heads, "kv_heads": a.kv_heads, "head_dim": a.head_dim,
        "mlp": a.mlp, "layers": a.layers, "vocab": a.vocab,
    })
    median = out["step_time_s"]
    if a.json:
        print(json.dumps(out))
    else:
        print(f"pytorch {torch.__version__}, {blas}, {a.dtype}, capability "
              f"{out['cpu_capability']}: {a.block} B={a.batch} T={a.seq} "
              f"C={a.emb} heads={a.heads}/{a.kv_heads}x{a.head_dim} "
              f"mlp={a.mlp} L={a.layers} V={a.vocab}, "
              f"{out['parameters']} parameters")
        print(f"step: median {median * 1e3:.2f} ms [{min(times) * 1e3:.2f}, "
              f"{max(times) * 1e3:.2f}] over {a.steps} steps, "
              f"{out['tokens_per_s']:.0f} tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
