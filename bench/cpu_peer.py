"""The PyTorch peer of bench/cpu_peer.exs: the same cases, shapes and dtypes, eager mode on the CPU
with two threads (EXBURN_BENCH_TORCH_THREADS overrides). Run by the .exs in the same invocation; prints one line per case:

    CASE<TAB>name<TAB>median_us<TAB>reps

    python3 bench/cpu_peer.py            # every case
    python3 bench/cpu_peer.py add_2x10   # only the named cases

Timing rule (same as the .exs): two warm-up calls, then `reps` timed calls where reps is chosen
so that the case runs about EXBURN_BENCH_TARGET_S seconds (default 0.5), at least 5 and at most
200; the median is printed. Every call consumes its result (reads one element with .item()).
"""
import os
import subprocess
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except Exception as e:  # torch missing or its shared libraries not loadable
    print(f"SKIP\ttorch not importable: {type(e).__name__}: {e}".replace("\n", " "))
    sys.exit(0)

# EXBURN_BENCH_TORCH_THREADS (default 2): on a shared machine whose other core is busy, two
# OpenMP threads wait on each other's wake-ups; 1 shows the kernels without that.
torch.set_num_threads(int(os.environ.get("EXBURN_BENCH_TORCH_THREADS", "2")))
TARGET_S = float(os.environ.get("EXBURN_BENCH_TARGET_S", "0.5"))


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def bench(fun, min_reps=5, max_reps=200):
    fun()
    t0 = time.perf_counter()
    fun()
    one = time.perf_counter() - t0
    reps = max(min_reps, min(max_reps, int(TARGET_S / max(one, 1e-9))))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fun()
        times.append(time.perf_counter() - t0)
    return median(times) * 1e6, reps


def first(t):
    """Consume the result: read one element (like to_binary(t, 1) on the ExBurn side)."""
    return t.reshape(-1)[0].item()


def sin_data(shape, dtype=torch.float32):
    n = 1
    for d in shape:
        n *= d
    return torch.sin(torch.arange(n, dtype=torch.float32) * 0.37).reshape(shape).to(dtype)


def scaled_iota(shape):
    n = 1
    for d in shape:
        n *= d
    return (torch.arange(n, dtype=torch.float32) / n).reshape(shape)


def composed_softmax(x):
    m = x.amax(dim=1, keepdim=True)
    e = torch.exp(x - m)
    return e / e.sum(dim=1, keepdim=True)


def composed_layer_norm(x, eps=1e-5):
    mu = x.mean(dim=1, keepdim=True)
    c = x - mu
    var = (c * c).mean(dim=1, keepdim=True)
    return c * torch.rsqrt(var + eps)


def mlp_data(n=60_000, features=784, classes=10):
    x = sin_data((n, features))
    y = x[:, :classes].argmax(dim=1)
    return x, y


def mlp_model():
    return torch.nn.Sequential(
        torch.nn.Linear(784, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 10),
    )


def train_epoch(model, opt, x, y, batch=128):
    n = x.shape[0]
    perm = torch.randperm(n)
    total = 0.0
    batches = 0
    for i in range(0, n, batch):
        idx = perm[i : i + batch]
        xb, yb = x[idx], y[idx]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        total += loss.item()
        batches += 1
    return total / batches


def cases():
    n = 1_000_000
    small_a, small_b = sin_data((2, 10)), torch.ones(2, 10)
    a, b = sin_data((n,)), torch.ones(n)
    m = sin_data((1000, 1000))
    sq = sin_data((1024, 1024))
    idx = (torch.arange(n, dtype=torch.int64) * 7919) % n
    mats = {k: (scaled_iota((k, k)), torch.ones(k, k)) for k in (256, 1024, 2048)}
    bf = (scaled_iota((1024, 1024)).to(torch.bfloat16), torch.ones(1024, 1024, dtype=torch.bfloat16))
    cx = sin_data((8, 32, 32, 32))
    ck = sin_data((64, 32, 3, 3)) * 0.1

    yield "add_2x10", lambda: first(small_a + small_b)
    yield "add_2x10_nodealloc", lambda: first(small_a + small_b)
    yield "add_1M", lambda: first(a + b)
    yield "add_1M_nodealloc", lambda: first(a + b)
    yield "exp_1M", lambda: first(torch.exp(a))
    zero = torch.zeros((), dtype=torch.float32)
    yield "max_1M_scalar", lambda: first(torch.maximum(a, zero))
    yield "sigmoid_1M", lambda: first(torch.sigmoid(a))
    yield "tanh_1M", lambda: first(torch.tanh(a))
    yield "erf_1M", lambda: first(torch.erf(a))
    yield "sum_1M_all", lambda: first(a.sum())
    yield "sum_1000x1000_axis1", lambda: first(m.sum(dim=1))
    yield "argmax_1M", lambda: first(a.argmax())
    yield "softmax_1024x1024", lambda: first(torch.softmax(sq, dim=1))
    yield "softmax_composed_1024x1024", lambda: first(composed_softmax(sq))
    yield "layer_norm_composed_1024x1024", lambda: first(composed_layer_norm(sq))
    yield "layer_norm_fused_1024x1024", lambda: first(F.layer_norm(sq, (1024,)))
    yield "softmax_1024x1024_defn", lambda: first(torch.softmax(sq, dim=1))
    yield "layer_norm_1024x1024_defn", lambda: first(F.layer_norm(sq, (1024,)))
    yield "take_1M", lambda: first(a[idx])
    yield "sort_1M", lambda: first(torch.sort(a).values)
    for k in (256, 1024, 2048):
        x, w = mats[k]
        yield f"dot_{k}", (lambda x=x, w=w: first(x @ w))
    yield "dot_bf16_1024", lambda: first(bf[0] @ bf[1])
    yield "conv2d_8x32x32x32_64x3x3", lambda: first(F.conv2d(cx, ck, padding=1))


def mlp_cases(selected):
    want = lambda name: not selected or name in selected
    if not any(want(c) for c in ("mlp_epoch", "predict_b1", "predict_b1024")):
        return
    torch.manual_seed(0)
    x, y = mlp_data()
    model = mlp_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    if want("mlp_epoch"):
        # warm-up on 1024 samples, then one timed epoch (as the .exs does)
        train_epoch(model, opt, x[:1024], y[:1024])
        rate = fma()
        t0 = time.perf_counter()
        loss = train_epoch(model, opt, x, y)
        us = (time.perf_counter() - t0) * 1e6
        print(f"CASE\tmlp_epoch\t{us:.1f}\t1\tloss={loss:.4f}{rate}", flush=True)
    model.eval()
    for name, rows in (("predict_b1", 1), ("predict_b1024", 1024)):
        if want(name):
            xb = x[:rows].clone()

            def run(xb=xb):
                with torch.no_grad():
                    return first(model(xb))

            rate = fma()
            us, reps = bench(run)
            print(f"CASE\t{name}\t{us:.1f}\t{reps}{rate}", flush=True)


def fma():
    """`fma=N`: the GFLOP/s the CPUs deliver now, from the probe the .exs built
    (EXBURN_FMA_PROBE), or "" without one."""
    probe = os.environ.get("EXBURN_FMA_PROBE")
    if not probe:
        return ""
    out = subprocess.run([probe, str(torch.get_num_threads())], capture_output=True, text=True)
    return f"\tfma={round(float(out.stdout.split()[0]))}" if out.returncode == 0 else ""


def main():
    selected = set(sys.argv[1:])
    print(f"INFO\ttorch {torch.__version__}, threads {torch.get_num_threads()}", flush=True)
    for name, fun in cases():
        if selected and name not in selected:
            continue
        rate = fma()
        us, reps = bench(fun)
        print(f"CASE\t{name}\t{us:.1f}\t{reps}{rate}", flush=True)
    mlp_cases(selected)


if __name__ == "__main__":
    main()
