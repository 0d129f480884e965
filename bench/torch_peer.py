"""The peer for the GPU benchmark: the same ops as ex_burn's `burn_bench device` example, done by PyTorch
on the same card in the same run. Prints lines in the same format.

    python3 bench/torch_peer.py
"""
import time

import torch


def timed(step, start_value, iters):
    """Like the Burn side: every iteration feeds an accumulator that is read back at the end."""
    step(start_value)
    torch.cuda.synchronize()
    start = time.perf_counter()
    acc = start_value
    for _ in range(iters):
        acc = step(acc)
    acc.cpu()
    return (time.perf_counter() - start) / iters


def main():
    dev = torch.device("cuda")
    # Plain f32 (no TF32), the precision the Burn run uses.
    torch.backends.cuda.matmul.allow_tf32 = False
    for op, size, iters in [("matmul", 4096, 20), ("matmul", 1024, 50), ("add", 1 << 24, 50)]:
        if op == "matmul":
            a = torch.rand(size, size, device=dev)
            b = torch.rand(size, size, device=dev)
            s = timed(lambda acc: acc + a @ b, a, iters)
            rate = f"{2 * size**3 / s / 1e12:.2f} TFLOP/s"
        else:
            a = torch.rand(size, device=dev)
            b = torch.rand(size, device=dev)
            s = timed(lambda acc: acc + b, a, iters)
            rate = f"{12 * size / s / 1e9:.1f} GB/s"
        print(f"BENCH device=torch:{torch.cuda.get_device_name()} op={op} size={size} ms={s * 1e3:.4f} {rate}")


if __name__ == "__main__":
    main()
