#!/usr/bin/python3
"""One GPT-2 training step in PyTorch: the peer for `multislice train`'s step.

The model of `multislice train` (src/model/gpt.h): byte-level GPT-2 with a
token and a position embedding, pre-LayerNorm blocks (eps 1e-5) of causal
multi-head self-attention (one fused qkv projection, biases) and an MLP with
GPT-2's tanh GELU, a final LayerNorm and a head tied to the token embedding;
mean cross-entropy over B*T positions. A step is what `train_step_bench`
times: forward, backward, the gradient's global norm clipped to 1.0, and
AdamW (betas 0.9, 0.95, eps 1e-8, weight decay 0.1 on the 2-D weights and
embeddings only). Attention is the explicit q k^T, causal mask, softmax, @ v
of nanoGPT without flash attention (PyTorch 1.13 has no
scaled_dot_product_attention).

One process, torch.set_num_threads(1), OpenBLAS and OpenMP on one thread;
f32 matmuls through the system BLAS (OpenBLAS: see bench/README.md).
MULTISLICE_MAX_ISA=avx2 (or --isa avx2) caps the peer as it caps ours:
PyTorch's own kernels (ATEN_CPU_CAPABILITY=avx2), its oneDNN
(DNNL_MAX_CPU_ISA=AVX2) and OpenBLAS (OPENBLAS_CORETYPE=HASWELL), so both
run AVX2 code on an AVX-512 machine.

Timing: --warmup untimed steps, then --steps timed ones; printed: median,
min, max of the step time and tokens/s; --json prints one object.

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
        description="One GPT-2 training step (forward, backward, clipping, "
        "AdamW) in PyTorch on one thread, the peer of train_step_bench")
    # Defaults: configs/quickstart.yml on one device.
    p.add_argument("--batch", type=int, default=16, help="B, sequences")
    p.add_argument("--seq", type=int, default=64, help="T, tokens each")
    p.add_argument("--emb", type=int, default=384, help="C, channels")
    p.add_argument("--heads", type=int, default=6, help="NH")
    p.add_argument("--mlp", type=int, default=1536, help="MLP width")
    p.add_argument("--layers", type=int, default=2, help="L")
    p.add_argument("--vocab", type=int, default=256, help="V")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--isa", default=os.environ.get("MULTISLICE_MAX_ISA", ""),
                   help="avx2: cap PyTorch, its oneDNN and OpenBLAS at AVX2 "
                   "(default: MULTISLICE_MAX_ISA; empty: no cap)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    for name in ("batch", "seq", "emb", "heads", "mlp", "layers", "vocab",
                 "steps"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be at least 1")
    if a.emb % a.heads:
        p.error("--emb must be divisible by --heads")
    if a.isa not in ("", "avx2", "x86-64-v3"):
        p.error(f"--isa: '{a.isa}' is not supported by the peer; expected "
                "avx2 or nothing")
    return a


def build_model(torch, a):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(a.emb, eps=1e-5)
            self.qkv = nn.Linear(a.emb, 3 * a.emb)
            self.proj = nn.Linear(a.emb, a.emb)
            self.ln2 = nn.LayerNorm(a.emb, eps=1e-5)
            self.fc = nn.Linear(a.emb, a.mlp)
            self.fc_proj = nn.Linear(a.mlp, a.emb)
            mask = torch.tril(torch.ones(a.seq, a.seq, dtype=torch.bool))
            self.register_buffer("mask", mask)

        def attention(self, x):
            B, T, C = x.shape
            hs = C // a.heads
            q, k, v = self.qkv(x).split(C, dim=2)
            q = q.view(B, T, a.heads, hs).transpose(1, 2)
            k = k.view(B, T, a.heads, hs).transpose(1, 2)
            v = v.view(B, T, a.heads, hs).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
            y = F.softmax(att, dim=-1) @ v
            return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))

        def forward(self, x):
            x = x + self.attention(self.ln1(x))
            return x + self.fc_proj(
                F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(a.vocab, a.emb)
            self.wpe = nn.Embedding(a.seq, a.emb)
            self.blocks = nn.ModuleList(Block() for _ in range(a.layers))
            self.lnf = nn.LayerNorm(a.emb, eps=1e-5)

        def forward(self, tokens, targets):
            pos = torch.arange(tokens.shape[1])
            x = self.wte(tokens) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            logits = F.linear(self.lnf(x), self.wte.weight)  # tied head
            return F.cross_entropy(logits.view(-1, a.vocab), targets.view(-1))

    torch.manual_seed(0)
    model = Gpt()
    for name, p in model.named_parameters():
        if p.dim() == 2:
            nn.init.normal_(p, std=0.02)
    return model


def main(argv):
    a = parse_args(argv)
    torch, blas = import_torch(a.isa)
    model = build_model(torch, a)
    times, loss = time_steps(torch, model, a)
    out = summary(torch, blas, model, a, times, loss)
    out.update({"batch": a.batch, "seq": a.seq, "emb": a.emb,
                "heads": a.heads, "mlp": a.mlp, "layers": a.layers,
                "vocab": a.vocab})
    median = out["step_time_s"]
    tokens_per_s = out["tokens_per_s"]
    if a.json:
        print(json.dumps(out))
    else:
        print(f"pytorch {torch.__version__}, {blas}, capability "
              f"{out['cpu_capability']}: GPT-2 B={a.batch} T={a.seq} "
              f"C={a.emb} NH={a.heads} mlp={a.mlp} L={a.layers}, "
              f"{out['parameters']} parameters")
        print(f"step: median {median * 1e3:.2f} ms [{min(times) * 1e3:.2f}, "
              f"{max(times) * 1e3:.2f}] over {a.steps} steps, "
              f"{tokens_per_s:.0f} tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
