# The NIF side of the CUDA precision benchmark (bench/cuda_precision.py is the PyTorch side; both
# run on the same card in the same invocation, see guides/devices.md):
#
#     mix run bench/cuda_precision.exs DIR [DEVICE]
#
# Reads the f32 inputs DIR/a.bin, DIR/b.bin (4096x4096) and DIR/x.bin, DIR/y.bin (16M) that the
# Python side wrote, times through the NIF (products: every iteration feeds an accumulator whose
# sum is read back at the end, median of five runs; adds: one at a time, each read before the
# next, so fusion can neither drop nor merge work):
#   matmul 4096² f32 at :highest and :high, bf16 matmul 4096², add of 16M f32
# and writes one product of each precision to DIR/exburn_<case>.bin for the error report.
alias ExBurn.Tensor, as: T

[dir | rest] = System.argv()
device = ExBurn.Device.resolve(List.first(rest) || "cuda")
n = 4096
m = 16_777_216

load = fn name, shape ->
  T.from_binary(File.read!(Path.join(dir, name)), :f32, shape: shape, device: device)
end

a = load.("a.bin", {n, n})
b = load.("b.bin", {n, n})
x = load.("x.bin", {m})
y = load.("y.bin", {m})

# three warm-up steps, then five timed runs of `iters` steps, of which the median is reported:
# autotune can still be timing candidates in the background during the first runs, which can
# make one run several times slower than the others. Only the accumulator's sum is read back
# (copying 64 MB to the host can take longer than the work).
median = fn xs -> xs |> Enum.sort() |> Enum.at(div(length(xs), 2)) end

timed = fn step, start, iters ->
  _ = T.to_binary(T.sum(step.(step.(step.(start)))))

  median.(
    for _ <- 1..5 do
      t0 = System.monotonic_time(:nanosecond)
      acc = Enum.reduce(1..iters, start, fn _, acc -> step.(acc) end)
      _ = T.to_binary(T.sum(acc))
      (System.monotonic_time(:nanosecond) - t0) / iters
    end
  )
end

report = fn name, size, ns, rate ->
  IO.puts(
    "BENCH side=exburn device=#{ExBurn.Device.format(device)} case=#{name} size=#{size} ms=#{Float.round(ns / 1.0e6, 4)} #{rate}"
  )
end

flops = fn ns -> "#{Float.round(2 * n * n * n / ns / 1.0e3, 2)} TFLOP/s" end

# bf16 only where the device holds it (not on Vulkan); `:high` reaches cuBLAS only (on other
# devices the row repeats Burn's f32 kernel)
for {name, level, type} <- [
      {"f32_highest", :highest, :f32},
      {"f32_high", :high, :f32},
      {"bf16", :highest, :bf16}
    ],
    ExBurn.supports_type?(device, type) do
  {ta, tb} = if type == :f32, do: {a, b}, else: {T.as_type(a, type), T.as_type(b, type)}

  ExBurn.with_matmul_precision(level, fn ->
    File.write!(Path.join(dir, "exburn_#{name}.bin"), T.dot(ta, tb) |> T.as_type(:f32) |> T.to_binary())
    ns = timed.(fn acc -> T.add(acc, T.dot(ta, tb)) end, ta, 20)
    report.(name, n, ns, flops.(ns))
  end)
end

# adds one at a time, each result's first element read before the next (PyTorch's side does
# the same with .item()): fusion would otherwise merge the chain into one kernel
timed_each = fn step, start, iters ->
  first = fn t -> T.to_binary(T.slice(t, [0], [1])) end
  Enum.reduce(1..3, start, fn _, acc -> tap(step.(acc), first) end)
  t0 = System.monotonic_time(:nanosecond)
  Enum.reduce(1..iters, start, fn _, acc -> tap(step.(acc), first) end)
  (System.monotonic_time(:nanosecond) - t0) / iters
end

ns = timed_each.(fn acc -> T.add(acc, y) end, x, 50)
report.("add_f32", m, ns, "#{Float.round(12 * m / ns, 1)} GB/s")

# adds queued back to back, as a training step or a pipeline issues them: k adds of distinct
# operand pairs per round, every result kept alive until one read of all their first elements.
# Fusion may merge the k adds into fewer kernels, but every operand is read and every result
# written, so the bytes moved are the same as k separate kernels'.
k = 8
xs = for i <- 0..(k - 1), do: T.add(x, i * 1.0)
ys = for i <- 0..(k - 1), do: T.subtract(y, i * 1.0)

# returns the host time spent issuing the k adds (before the read)
round = fn ->
  t0 = System.monotonic_time(:nanosecond)
  outs = Enum.zip_with(xs, ys, &T.add/2)
  issued = System.monotonic_time(:nanosecond) - t0
  _ = outs |> Enum.map(&T.slice(&1, [0], [1])) |> T.concatenate() |> T.sum() |> T.to_binary()
  Enum.each(outs, &T.deallocate/1)
  issued
end

Enum.each(1..3, fn _ -> round.() end)
t0 = System.monotonic_time(:nanosecond)
issued = Enum.map(1..10, fn _ -> round.() end) |> Enum.sum()
ns = (System.monotonic_time(:nanosecond) - t0) / (10 * k)
issue_us = Float.round(issued / (10 * k) / 1000, 1)
report.("add_f32_many", m, ns, "#{Float.round(12 * m / ns, 1)} GB/s issue_us=#{issue_us}")
