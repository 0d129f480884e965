"""PyTorch's side of bench/gpu_train.exs: the same models, data, loss, optimizer and batches,
epoch by epoch on one device, printed in the same format.

    python3 bench/gpu_train_peer.py cuda [mlp] [lstm] [gru]
"""
import math
import os
import statistics
import sys
import time

import torch
from torch import nn


def mlp_data(n, features, classes, device):
    x = torch.sin(torch.arange(n * features, dtype=torch.float32, device=device).reshape(n, features) * 0.37)
    return x, x[:, :classes].argmax(dim=1)


def token_data(n, length, vocab, device):
    i = torch.arange(n, dtype=torch.int64).reshape(n, 1)
    j = torch.arange(length, dtype=torch.int64).reshape(1, length)
    tokens = (i * 7919 + j * 104729 + torch.div(i * j, 13, rounding_mode="floor")) % vocab
    labels = ((i[:, 0] * 7919) % vocab) % 2
    return tokens.to(device), labels.to(device)


class Rnn(nn.Module):
    def __init__(self, kind):
        super().__init__()
        cell = nn.LSTM if kind == "lstm" else nn.GRU
        self.emb = nn.Embedding(1000, 64)
        self.r1 = cell(64, 128, batch_first=True)
        self.r2 = cell(128, 64, batch_first=True)
        self.out = nn.Linear(64, 2)

    def forward(self, x):
        h, _ = self.r1(self.emb(x))
        h, _ = self.r2(h)
        return self.out(h[:, -1, :])


def model(name, device):
    if name == "mlp":
        m = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
        return m.to(device), mlp_data(60_000, 784, 10, device), 128
    return Rnn(name).to(device), token_data(8192, 32, 1000, device), 64


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run(name, device, epochs):
    t0 = time.perf_counter()
    m, (x, y), batch = model(name, device)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    sync(device)
    build = time.perf_counter() - t0
    n = x.shape[0]
    steps = math.ceil(n / batch)
    secs = []
    for _ in range(epochs):
        sync(device)
        start = time.perf_counter()
        total = 0.0
        for s in range(steps):
            xb, yb = x[s * batch:(s + 1) * batch], y[s * batch:(s + 1) * batch]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(m(xb), yb)
            loss.backward()
            opt.step()
            total += loss.detach()
        last = float(total) / steps
        sync(device)
        secs.append(time.perf_counter() - start)
    steady = statistics.median_low(secs[1:]) if len(secs) > 1 else secs[0]
    print(
        f"{name} PyTorch {torch.__version__} {device}: build {build:.3f} s, "
        f"epochs {' '.join(f'{s:.3f}' for s in secs)} s (first {secs[0]:.3f}), "
        f"steady {steady:.3f} s, step {steady / steps * 1000:.3f} ms, {round(n / steady)} samples/s, "
        f"last loss {last:.3f} ({n} samples, batch {batch}, {steps} steps)",
        flush=True,
    )


def main():
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    names = sys.argv[2:] or ["mlp", "lstm", "gru"]
    if device == "cpu":
        torch.set_num_threads(int(os.environ.get("EXBURN_BENCH_TORCH_THREADS", "2")))
    epochs = int(os.environ.get("EXBURN_BENCH_EPOCHS", "4"))
    print("load average at start:", " ".join(open("/proc/loadavg").read().split()[:3]))
    for name in names:
        run(name, device, epochs)


if __name__ == "__main__":
    main()
