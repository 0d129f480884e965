"""The PyTorch side of the CUDA precision benchmark, and the error report for both sides.

    python3 bench/cuda_precision.py prepare DIR   # inputs (f32 .bin files) for both sides
    python3 bench/cuda_precision.py torch DIR     # PyTorch timings, same card; writes torch_<case>.bin
    python3 bench/cuda_precision.py errors DIR    # every <side>_<case>.bin against an f64 product
    python3 bench/cuda_precision.py steps DIR CASE  # the loops of `burn_bench steps` (bf16, add),
                                                    # per round, for bench/cuda_kernel_profile.sh

Timing is the same as the NIF side (bench/cuda_precision.exs): three warm-up steps, then five runs
in which every iteration feeds an accumulator whose sum is read back at the end; the median run
is reported.
"""
import glob
import os
import sys
import time

import torch

N = 4096
M = 1 << 24


def timed(step, start_value, iters, warmup=3, runs_of=5):
    # warm-up: first steps pick algorithms and (for the optimizer) create state
    acc = start_value
    for _ in range(warmup):
        acc = step(acc)
    torch.cuda.synchronize()
    runs = []
    for _ in range(runs_of):
        start = time.perf_counter()
        acc = start_value
        for _ in range(iters):
            acc = step(acc)
        # read back one number that depends on every iteration: copying the whole accumulator
        # (64 MB to pageable memory) can take longer than the work
        acc.float().sum().item()
        runs.append((time.perf_counter() - start) / iters)
    # the median run, as the NIF side reports
    return sorted(runs)[len(runs) // 2]


def timed_each(step, start_value, iters):
    """One step at a time, its first element read before the next (as the ExBurn sides do)."""
    acc = start_value
    for _ in range(3):
        acc = step(acc)
        acc[0].item()
    start = time.perf_counter()
    acc = start_value
    for _ in range(iters):
        acc = step(acc)
        acc[0].item()
    return (time.perf_counter() - start) / iters


def timed_many(x, y, k=8, rounds=10):
    """Adds queued back to back: k adds of distinct operand pairs per round, every result kept
    until one read of all their first elements (as bench/cuda_precision.exs does)."""
    xs = [x + i for i in range(k)]
    ys = [y - i for i in range(k)]

    def one_round():
        outs = [a + b for a, b in zip(xs, ys)]
        torch.stack([o[0] for o in outs]).sum().item()

    for _ in range(3):
        one_round()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(rounds):
        one_round()
    return (time.perf_counter() - start) / (rounds * k)


def load(d, name, shape):
    return torch.from_file(os.path.join(d, name), size=int(torch.tensor(shape).prod()), dtype=torch.float32).reshape(shape)


def prepare(d):
    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(15)
    for name, shape in [("a", (N, N)), ("b", (N, N))]:
        torch.randn(shape, generator=g).numpy().tofile(os.path.join(d, f"{name}.bin"))
    for name in ["x", "y"]:
        torch.rand(M, generator=g).numpy().tofile(os.path.join(d, f"{name}.bin"))


def bench(d):
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name()
    a, b = load(d, "a.bin", (N, N)).to(dev), load(d, "b.bin", (N, N)).to(dev)
    x, y = load(d, "x.bin", (M,)).to(dev), load(d, "y.bin", (M,)).to(dev)

    def line(case, size, s, rate):
        print(f"BENCH side=torch device=torch:{name} case={case} size={size} ms={s * 1e3:.4f} {rate}", flush=True)

    for case, tf32, dtype in [("f32_highest", False, torch.float32), ("f32_high", True, torch.float32), ("bf16", False, torch.bfloat16)]:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        ta, tb = a.to(dtype), b.to(dtype)
        (ta @ tb).float().cpu().numpy().tofile(os.path.join(d, f"torch_{case}.bin"))
        s = timed(lambda acc: acc + ta @ tb, ta, 20)
        line(case, N, s, f"{2 * N**3 / s / 1e12:.2f} TFLOP/s")
    torch.backends.cuda.matmul.allow_tf32 = False
    s = timed_each(lambda acc: acc + y, x, 50)
    line("add_f32", M, s, f"{12 * M / s / 1e9:.1f} GB/s")
    s = timed_many(x, y)
    line("add_f32_many", M, s, f"{12 * M / s / 1e9:.1f} GB/s")

    # conv2d forward and forward+backward, f32 (cuDNN; TF32 off and on)
    for tf32 in [False, True]:
        torch.backends.cudnn.allow_tf32 = tf32
        g = torch.Generator(device=dev).manual_seed(1)
        xi = torch.randn(32, 64, 56, 56, device=dev, generator=g)
        w = torch.randn(128, 64, 3, 3, device=dev, generator=g, requires_grad=True)
        fwd = lambda acc: acc + torch.nn.functional.conv2d(xi, w, padding=1).detach()
        out0 = torch.nn.functional.conv2d(xi, w, padding=1).detach()
        s = timed(fwd, out0, 20)
        fl = 2 * 32 * 128 * 56 * 56 * 64 * 9
        line(f"conv2d_fwd_f32_{'tf32' if tf32 else 'highest'}", "32x64x56x56*128x3x3", s, f"{fl / s / 1e12:.2f} TFLOP/s")

        def fwd_bwd(acc):
            w.grad = None
            torch.nn.functional.conv2d(xi, w, padding=1).square().mean().backward()
            return acc + w.grad

        s = timed(fwd_bwd, torch.zeros_like(w), 20)
        line(f"conv2d_fwdbwd_f32_{'tf32' if tf32 else 'highest'}", "32x64x56x56*128x3x3", s, f"{3 * fl / s / 1e12:.2f} TFLOP/s")
    torch.backends.cudnn.allow_tf32 = True

    # MLP training step (f32, Adam): 1024 -> 4096 -> 4096 -> 10, batch 1024, same as burn_bench mlp
    for tf32 in [False, True]:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        xb = torch.randn(1024, 1024, device=dev)
        yb = torch.randint(0, 10, (1024,), device=dev)

        def step(acc):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            return acc + loss.detach()

        s = timed(step, torch.zeros((), device=dev), 20)
        line(f"mlp_step_f32_{'tf32' if tf32 else 'highest'}", "1024x[1024,4096,4096,10]", s, f"{s * 1e3:.3f} ms/step")
    torch.backends.cuda.matmul.allow_tf32 = False


def errors(d):
    a64 = load(d, "a.bin", (N, N)).double().cuda()
    b64 = load(d, "b.bin", (N, N)).double().cuda()
    ref = {"f32": (a64 @ b64).cpu()}
    ref["bf16"] = (a64.bfloat16().double() @ b64.bfloat16().double()).cpu()
    del a64, b64
    for path in sorted(glob.glob(os.path.join(d, "*_*.bin"))):
        base = os.path.basename(path)[:-4]
        side, case = base.split("_", 1)
        if side not in ("torch", "exburn", "burn"):
            continue
        got = torch.from_file(path, size=N * N, dtype=torch.float32).double().reshape(N, N)
        r = ref["bf16" if case.startswith("bf16") else "f32"]
        err = (got - r).abs()
        print(f"ERROR side={side} case={case} max_rel={err.max().item() / r.abs().max().item():.3e} "
              f"rel_fro={(err.norm() / r.norm()).item():.3e}", flush=True)


def steps(d, case):
    """The loops `burn_bench steps DIR CASE` runs, in the same rounds, each timed as `bench` times
    them: three untimed steps, then the timed ones."""
    dev = torch.device("cuda")
    if case == "bf16":
        a, b = (load(d, f"{n}.bin", (N, N)).to(dev).bfloat16() for n in "ab")
        rounds, time_round = 8, lambda: timed(lambda acc: acc + a @ b, a, 20, runs_of=1)
    else:
        x, y = load(d, "x.bin", (M,)).to(dev), load(d, "y.bin", (M,)).to(dev)
        rounds, time_round = 5, lambda: timed_each(lambda acc: acc + y, x, 10)
    for r in range(rounds):
        us = time_round() * 1e6
        print(f"STEPS side=torch device=torch:{torch.cuda.get_device_name()} case={case} round={r} us_per_step={us:.1f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "steps":
        steps(sys.argv[2], sys.argv[3])
    else:
        {"prepare": prepare, "torch": bench, "errors": errors}[sys.argv[1]](sys.argv[2])
