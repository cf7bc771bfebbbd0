#!/usr/bin/python3
"""The shardings.py training step in PyTorch: the peer for `multislice shardings`.

Spec section 3.3 (MaxText pedagogical_examples/shardings.py): L layers, each
with two weights EMB2FF and FF2EMB of shape (D_FF, D_EMB), D_FF = 4 * D_EMB,
initialised 1e-4 * normal; input X (BATCH, D_EMB) uniform [0, 1); layer
M1 = sigmoid(x @ EMB2FF^T), M2 = sigmoid(M1 @ FF2EMB); loss = sum(output); one
step = forward + backward + SGD p - 1e-4 * g. BATCH = num_devices * batch_size.

One process per device, torch.set_num_threads(1) in each, and
DistributedDataParallel over Gloo (file:// store) when there are several
devices; each process holds BATCH / num_devices rows. Gloo in PyTorch 1.13
cannot reduce bf16, so `--dtype bf16` keeps f32 weights and runs forward and
backward under torch.autocast("cpu", dtype=torch.bfloat16) (matmuls in bf16
through oneDNN); `--dtype f32` is plain f32 (matmuls through the system BLAS,
see bench/README.md).

Timing: one untimed warm-up step, then --steps timed steps; before each a
barrier, and a step's time is that of the slowest rank. Reported: median, min
and max; TFLOP per device = 6 * 2 * D_FF * D_EMB * L * BATCH / 1e12 /
num_devices and TFLOP/s per device = that / median step time.

Runs with Debian 12's python3-torch (PyTorch 1.13) under /usr/bin/python3.
"""

import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="shardings.py training step in PyTorch (DDP over Gloo, "
        "one process per CPU device)")
    # Defaults as `multislice shardings` (sized for a 2-core CPU machine; the
    # original's TPU defaults are -d 2048 -b 131072).
    p.add_argument("-d", "--embedding_dimension", type=int, default=1024)
    p.add_argument("-b", "--batch_size", type=int, default=2048,
                   help="rows per device (BATCH = num_devices * batch_size)")
    p.add_argument("-n", "--num_layers", type=int, default=4)
    p.add_argument("--num_devices", type=int, default=1,
                   help="processes, one per device, one thread each")
    p.add_argument("--dtype", choices=("bf16", "f32"), default="bf16")
    p.add_argument("--steps", type=int, default=5,
                   help="timed steps after one untimed warm-up")
    p.add_argument("--timeout_seconds", type=float, default=300.0,
                   help="bound on process-group setup and on every collective")
    p.add_argument("--openblas_coretype", default="auto",
                   help="f32 BLAS kernels: auto (default: ignore an inherited "
                   "OPENBLAS_CORETYPE and let OpenBLAS detect the CPU), env "
                   "(keep OPENBLAS_CORETYPE), or a core name such as SKYLAKEX")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of text")
    a = p.parse_args(argv)
    for name in ("embedding_dimension", "batch_size", "num_layers",
                 "num_devices", "steps"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be at least 1")
    if a.timeout_seconds <= 0:
        p.error("--timeout_seconds must be positive")
    return a


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _openblas_corename():
    """Core type the system libblas.so.3 picks, if it is OpenBLAS (else None).

    Run in a child process: OpenBLAS reads OPENBLAS_CORETYPE when it loads."""
    code = ("import ctypes\n"
            "l = ctypes.CDLL('libblas.so.3')\n"
            "f = getattr(l, 'openblas_get_corename', None)\n"
            "if f is not None:\n"
            "    f.restype = ctypes.c_char_p\n"
            "    print(f().decode())\n")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                             text=True, timeout=30, env=os.environ.copy())
        name = out.stdout.strip()
        return name or None
    except (OSError, subprocess.SubprocessError):
        return None


_WEAK_CORES = ("prescott", "core2", "katmai", "coppermine", "northwood",
               "banias", "atom", "unknown")


def prepare_environment(coretype):
    """Threads and BLAS set up before torch is imported (children inherit).

    One thread per device: OpenMP (oneDNN) and OpenBLAS are pinned to 1
    thread. f32 matmuls go to the system libblas.so.3 (OpenBLAS when
    libopenblas0-pthread is installed). coretype "auto" drops any inherited
    OPENBLAS_CORETYPE and lets OpenBLAS detect the CPU, except that where
    0.3.21 does not know the CPU and falls back to its Prescott kernels (seen on
    Intel Xeons with AMX) the best core type the CPU flags allow is chosen;
    "env" keeps the environment's OPENBLAS_CORETYPE; any other value is set as
    OPENBLAS_CORETYPE. Returns a description of the BLAS in use."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # ranks meet on loopback
    if coretype == "auto":
        os.environ.pop("OPENBLAS_CORETYPE", None)
    elif coretype != "env":
        os.environ["OPENBLAS_CORETYPE"] = coretype
    name = _openblas_corename()
    if name is None:
        return "reference or unknown BLAS"
    if coretype == "auto" and name.lower() in _WEAK_CORES:
        flags = _cpu_flags()
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= flags:
            os.environ["OPENBLAS_CORETYPE"] = "SKYLAKEX"
        elif {"avx2", "fma"} <= flags:
            os.environ["OPENBLAS_CORETYPE"] = "HASWELL"
        if "OPENBLAS_CORETYPE" in os.environ:
            name = _openblas_corename() or name
    return f"OpenBLAS {name}"


def _die_with_parent():
    """Linux: a child gets SIGKILL when the launching process dies."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def build(args, rank, torch):
    d_emb = args.embedding_dimension
    d_ff = 4 * d_emb
    torch.manual_seed(0)  # same weights everywhere (DDP also broadcasts)
    layers = torch.nn.ParameterList()
    for _ in range(args.num_layers):
        layers.append(torch.nn.Parameter(1e-4 * torch.randn(d_ff, d_emb)))  # EMB2FF
        layers.append(torch.nn.Parameter(1e-4 * torch.randn(d_ff, d_emb)))  # FF2EMB

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = layers

        def forward(self, x):
            for i in range(0, len(self.layers), 2):
                m1 = torch.sigmoid(torch.nn.functional.linear(x, self.layers[i]))
                x = torch.sigmoid(torch.matmul(m1, self.layers[i + 1]))
            return x

    gen = torch.Generator().manual_seed(1 + rank)
    x = torch.rand(args.batch_size, d_emb, generator=gen)
    if args.dtype == "bf16":
        x = x.to(torch.bfloat16)
    return Model(), x


def train(rank, args, result_path, distributed):
    """One device's training loop; rank 0 writes the result file."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    model, x = build(args, rank, torch)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(
            model, gradient_as_bucket_view=True)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    autocast = args.dtype == "bf16"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(x).sum()
        loss.backward()
        opt.step()
        return loss

    times = []
    loss = None
    for i in range(1 + args.steps):
        if distributed:
            dist.barrier()
        t0 = time.perf_counter()
        loss = step()
        t1 = time.perf_counter()
        if i > 0:
            times.append(t1 - t0)
    slowest = torch.tensor(times, dtype=torch.float64)
    if distributed:
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        out = {"times": slowest.tolist(), "loss": float(loss),
               "torch_version": torch.__version__,
               "mkldnn": bool(torch.backends.mkldnn.is_available())}
        tmp = result_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f)
        os.replace(tmp, result_path)
    if distributed:
        dist.barrier()  # every collective has completed on every rank


def worker(rank, args, store_path, result_path):
    """A spawned rank: one process, one thread, Gloo over a file:// store.

    It ends with os._exit: PyTorch 1.13 can deadlock while tearing down a DDP
    model and its Gloo process group (~ProcessGroupGloo joins a worker thread
    that waits for the GIL the main thread holds; seen here), so no teardown
    runs. A failure prints its traceback and exits with status 1, which makes
    the launcher stop the other ranks."""
    _die_with_parent()
    code = 1
    try:
        import torch.distributed as dist
        dist.init_process_group(
            "gloo", init_method="file://" + store_path, rank=rank,
            world_size=args.num_devices,
            timeout=datetime.timedelta(seconds=args.timeout_seconds))
        train(rank, args, result_path, distributed=True)
        code = 0
    except BaseException:  # noqa: B902  (reported, then a hard exit)
        import traceback
        print(f"pytorch_shardings: rank {rank} failed:", file=sys.stderr)
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class RankFailed(Exception):
    pass


def run_ranks(mp, args, store_path, result_path):
    """Spawns one process per device and waits for all of them.

    When a rank exits with a non-zero status (its traceback is on stderr) or
    this function is left any other way (Ctrl-C, SIGTERM, an error), the ranks
    still alive get SIGTERM, then SIGKILL after 5 s, and are reaped, so that
    every wait is bounded even for a rank that is stuck or stopped. Ranks also
    get SIGKILL if this process dies (PR_SET_PDEATHSIG)."""
    from multiprocessing.connection import wait

    def on_sigterm(signum, frame):
        raise SystemExit(128 + signum)
    old_handler = signal.signal(signal.SIGTERM, on_sigterm)
    ctx = mp.start_processes(worker, args=(args, store_path, result_path),
                             nprocs=args.num_devices, join=False, daemon=True,
                             start_method="spawn")
    procs = ctx.processes
    try:
        pending = {p.sentinel: (i, p) for i, p in enumerate(procs)}
        while pending:
            for sentinel in wait(list(pending), timeout=1.0):
                i, p = pending.pop(sentinel)
                p.join()
                if p.exitcode != 0:
                    how = (f"signal {signal.Signals(-p.exitcode).name}"
                           if p.exitcode < 0 else f"status {p.exitcode}")
                    raise RankFailed(f"rank {i} exited with {how}")
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + 5.0
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
        signal.signal(signal.SIGTERM, old_handler)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    blas = prepare_environment(args.openblas_coretype)
    import torch
    import torch.multiprocessing as mp

    n = args.num_devices
    d_emb = args.embedding_dimension
    d_ff = 4 * d_emb
    batch = n * args.batch_size
    parameters = 2 * d_ff * d_emb * args.num_layers
    act_bytes = 2 if args.dtype == "bf16" else 4
    param_bytes = 4 * parameters  # weights are stored f32 in both modes
    activation_bytes = act_bytes * batch * (d_ff + d_emb) * args.num_layers
    tflop = 6 * parameters * batch / 1e12 / n

    if not args.json:
        print(f"devices: {[f'cpu:{i}' for i in range(n)]}")
        print(f"number of devices: {n}")
        print(f"torch {torch.__version__}, mkldnn available: "
              f"{torch.backends.mkldnn.is_available()}, BLAS: {blas}, "
              f"{'DistributedDataParallel over Gloo' if n > 1 else 'one process'}")
        print(f"total {(param_bytes + activation_bytes) / 1e9} GB, parameters "
              f"{param_bytes / 1e9} GB, activations {activation_bytes / 1e9} GB",
              flush=True)

    with tempfile.TemporaryDirectory(prefix="pytorch_shardings.") as tmp:
        store_path = os.path.join(tmp, "store")
        result_path = os.path.join(tmp, "result.json")
        if n == 1:
            train(0, args, result_path, distributed=False)
        else:
            run_ranks(mp, args, store_path, result_path)
        with open(result_path) as f:
            res = json.load(f)

    times = res["times"]
    med = statistics.median(times)
    out = {
        "framework": "pytorch",
        "torch_version": res["torch_version"],
        "num_devices": n,
        "dtype": args.dtype,
        "embedding_dimension": d_emb,
        "batch_size": args.batch_size,
        "num_layers": args.num_layers,
        "step_time_s": med,
        "step_time_min_s": min(times),
        "step_time_max_s": max(times),
        "tflop_per_device": tflop,
        "tflops_per_device": tflop / med,
        "step_times_s": times,
        "mkldnn_available": res["mkldnn"],
        "blas": blas,
    }
    if args.json:
        print(json.dumps(out), flush=True)
    else:
        print(f"average time: {statistics.mean(times)}, median {med}, "
              f"min {min(times)}, max {max(times)}, timings (seconds) {times}")
        print(f"time is {med} seconds, TFLOP is {tflop}, TFLOP/s is {tflop / med}",
              flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RankFailed as e:
        print(f"pytorch_shardings: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("pytorch_shardings: interrupted", file=sys.stderr)
        sys.exit(130)
