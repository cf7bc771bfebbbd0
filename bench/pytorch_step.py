"""What the PyTorch training-step peers share (pytorch_gpt_step.py,
pytorch_llama_step.py): the environment of one thread under an optional AVX2
cap, and the timed step (forward, backward, clipping to 1.0, AdamW with
betas 0.9, 0.95, eps 1e-8 and weight decay 0.1 on the 2-D weights and
embeddings only), as `train_step_bench` times ours."""

import os
import statistics
import time

from pytorch_shardings import prepare_environment


def import_torch(isa):
    """Caps PyTorch's kernels, its oneDNN and OpenBLAS at AVX2 when `isa` is
    set, pins everything to one thread, imports torch. Returns (torch, the
    BLAS in use)."""
    if isa:
        os.environ["ATEN_CPU_CAPABILITY"] = "avx2"
        os.environ["DNNL_MAX_CPU_ISA"] = "AVX2"
        coretype = "HASWELL"
    else:
        coretype = "auto"
    blas = prepare_environment(coretype)
    import torch

    torch.set_num_threads(1)
    return torch, blas


def time_steps(torch, model, a, bf16=False):
    """Times a.warmup untimed and a.steps timed steps of `model` (called as
    model(tokens, targets) -> mean loss) on fixed random tokens of
    a.batch x a.seq over a.vocab; the forward under bf16 autocast when asked.
    Returns (step times in seconds, the last loss)."""
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen)
    targets = torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen)
    times = []
    for i in range(a.warmup + a.steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        elapsed = time.perf_counter() - start
        if i >= a.warmup:
            times.append(elapsed)
    return times, float(loss)


def summary(torch, blas, model, a, times, loss):
    """The fields every peer prints (step time median, min, max, tokens/s)."""
    median = statistics.median(times)
    return {
        "framework": "pytorch",
        "torch_version": torch.__version__,
        "blas": blas,
        "cpu_capability": torch.backends.cpu.get_cpu_capability()
        if hasattr(torch.backends, "cpu") else "unknown",
        "parameters": sum(p.numel() for p in model.parameters()),
        "step_time_s": median, "step_time_min_s": min(times),
        "step_time_max_s": max(times),
        "tokens_per_s": a.batch * a.seq / median,
        "loss": loss, "step_times_s": times,
    }
