# Where the time of bench/cpu_peer.exs's worst ExBurn/PyTorch ratios goes: the same cases cut
# into their pieces, each timed like cpu_peer.exs (two warm-ups, median of reps for ~0.3 s).
#
#   MIX_ENV=test mix run bench/cpu_peer_breakdown.exs
alias ExBurn.Native
alias ExBurn.Tensor, as: T

median = fn xs ->
  s = Enum.sort(xs)
  Enum.at(s, div(length(s), 2))
end

bench = fn fun ->
  fun.()
  {one, _} = :timer.tc(fun)
  reps = (0.3e6 / max(one, 1)) |> trunc() |> min(500) |> max(5)
  median.(for _ <- 1..reps, do: elem(:timer.tc(fun), 0))
end

row = fn label, fun ->
  IO.puts(String.pad_trailing(label, 58) <> String.pad_leading("#{bench.(fun)} µs", 12))
end

load = fn -> File.read!("/proc/loadavg") |> String.split() |> Enum.take(3) |> Enum.join(" ") end
wrap = &ExBurn.Tensor.Util.wrap/1

consume = fn t ->
  T.to_binary(t, 1)
  T.deallocate(t)
end

sin_data = fn shape -> T.iota(shape, :f32) |> T.multiply(0.37) |> T.sin() end

IO.puts("load average at start: #{load.()}")

IO.puts("\n## per-op overhead, add {2,10} (add + to_binary(t, 1) + deallocate = 3 NIF calls)")
sa = sin_data.({2, 10})
sb = T.ones({2, 10}, :f32)
row.("empty fun (timer floor)", fn -> :ok end)
row.("Native.shape (regular NIF, no work)", fn -> Native.shape(sa.ref) end)

row.("Native.binary(:add) raw (dirty NIF), result dropped", fn ->
  Native.binary(:add, sa.ref, sb.ref, {:f, 32})
end)

row.("T.add (Elixir checks + dirty NIF), result dropped", fn -> T.add(sa, sb) end)
row.("T.to_binary(t, 1) alone (dirty NIF)", fn -> T.to_binary(sa, 1) end)
row.("T.add + deallocate (regular NIF)", fn -> T.add(sa, sb) |> T.deallocate() end)
row.("T.add + to_binary(1) + deallocate (the case)", fn -> T.add(sa, sb) |> consume.() end)

IO.puts("\n## add 1M: fresh memory vs reused")
a = sin_data.({1_000_000})
b = T.ones({1_000_000}, :f32)
row.("add 1M + to_binary + deallocate", fn -> T.add(a, b) |> consume.() end)
row.("add 1M + to_binary, left to GC", fn -> T.add(a, b) |> T.to_binary(1) end)

row.("add 1M, left to GC, :erlang.garbage_collect each call", fn ->
  T.add(a, b) |> T.to_binary(1)
  :erlang.garbage_collect()
end)

IO.puts("\n## sum {1000,1000} along axis 1 (f32 sums widen to f64; CPU trailing block = gemv with ones)")
m = sin_data.({1000, 1000})
m64 = T.as_type(m, {:f, 64})
ones64 = T.ones({1000}, {:f, 64})
row.("sum f32 axis 1 (the case)", fn -> T.sum(m, axes: [1]) |> consume.() end)
row.("  piece: as_type f32 -> f64 (1M)", fn -> T.as_type(m, {:f, 64}) |> consume.() end)
row.("  piece: f64 dot {1000,1000} . ones{1000}", fn -> T.dot(m64, ones64) |> consume.() end)

row.("  ref: sum of an f64 input axis 1 (no widening, sum_dim)", fn -> T.sum(m64, axes: [1]) |> consume.() end)

row.("  ref: reduce_max f32 axis 1 (no widening)", fn -> T.reduce_max(m, axes: [1]) |> consume.() end)
row.("  ref: f32 dot {1000,1000} . ones{1000}", fn -> T.dot(m, T.ones({1000}, :f32)) |> consume.() end)
row.("sum f32 1M all axes", fn -> T.sum(a) |> consume.() end)
row.("  piece: as_type f32 -> f64 (1M flat)", fn -> T.as_type(a, {:f, 64}) |> consume.() end)

row.("  piece: ones({1M,1}) f64 (the ones operand, made per call)", fn ->
  T.ones({1_000_000, 1}, {:f, 64}) |> consume.()
end)

a64 = T.as_type(a, {:f, 64})
ones1m = T.ones({1_000_000}, {:f, 64})
row.("  piece: f64 dot 1M . ones 1M", fn -> T.dot(a64, ones1m) |> consume.() end)
row.("  ref: reduce_max f32 1M all axes (no widening)", fn -> T.reduce_max(a) |> consume.() end)

IO.puts("\n## take 1M (indices are bounds-checked: two compares, an or, an any and a read-back)")
idx = T.iota({1_000_000}, {:s, 64}) |> T.multiply(7919) |> T.remainder(1_000_000)
row.("take (the case)", fn -> Native.take(a.ref, idx.ref, 0) |> wrap.() |> consume.() end)

row.("  ~check: any(idx < 0 or idx >= n)", fn ->
  T.logical_or(T.less(idx, 0), T.greater_equal(idx, 1_000_000)) |> T.any() |> consume.()
end)

row.("  ref: add s64 1M (one pass over the indices)", fn -> T.add(idx, 1) |> consume.() end)

IO.puts("\n## conv2d x{8,32,32,32} k{64,32,3,3} pad 1 (NCHW; im2col gemm = {8192,288}.{288,64})")
cx = sin_data.({8, 32, 32, 32})
ck = sin_data.({64, 32, 3, 3}) |> T.multiply(0.1)
spec = {[1, 1], [{1, 1}, {1, 1}], [1, 1], [1, 1], 1, 1, [0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]}
row.("conv (the case)", fn -> Native.conv(cx.ref, ck.ref, spec, {:f, 32}) |> wrap.() |> consume.() end)
cols = sin_data.({8192, 288})
kk = sin_data.({288, 64})
row.("  ref: same-FLOP gemm {8192,288} . {288,64}", fn -> T.dot(cols, kk) |> consume.() end)

row.("  ref: transpose NCHW->NHWC of the input + copy", fn ->
  cx |> T.transpose(axes: [0, 2, 3, 1]) |> T.add(0.0) |> consume.()
end)

IO.puts("\n## layer norm composed {1024,1024}, op by op")
sq = sin_data.({1024, 1024})
mu = T.mean(sq, axes: [1], keep_axes: true)
c = T.subtract(sq, mu)
cc = T.multiply(c, c)
var = T.mean(cc, axes: [1], keep_axes: true)
r = T.rsqrt(T.add(var, 1.0e-5))
row.("mean axis 1 keep", fn -> T.mean(sq, axes: [1], keep_axes: true) |> consume.() end)
row.("subtract (broadcast {1024,1})", fn -> T.subtract(sq, mu) |> consume.() end)
row.("multiply c*c", fn -> T.multiply(c, c) |> consume.() end)
row.("mean axis 1 keep (2nd)", fn -> T.mean(cc, axes: [1], keep_axes: true) |> consume.() end)
row.("add eps + rsqrt ({1024,1})", fn -> T.rsqrt(T.add(var, 1.0e-5)) |> consume.() end)
row.("multiply (broadcast {1024,1})", fn -> T.multiply(c, r) |> consume.() end)

IO.puts("\n## softmax composed {1024,1024}, op by op")
mx = T.reduce_max(sq, axes: [1], keep_axes: true)
e = T.exp(T.subtract(sq, mx))
se = T.sum(e, axes: [1], keep_axes: true)
row.("reduce_max axis 1 keep", fn -> T.reduce_max(sq, axes: [1], keep_axes: true) |> consume.() end)
row.("subtract (broadcast {1024,1})", fn -> T.subtract(sq, mx) |> consume.() end)
row.("exp {1024,1024}", fn -> T.exp(c) |> consume.() end)
row.("sum axis 1 keep (widened to f64)", fn -> T.sum(e, axes: [1], keep_axes: true) |> consume.() end)
row.("divide (broadcast {1024,1})", fn -> T.divide(e, se) |> consume.() end)

IO.puts("\n## bf16 matmul 1024")
bfa = T.as_type(sin_data.({1024, 1024}), {:bf, 16})
bfb = T.ones({1024, 1024}, {:bf, 16})
row.("dot bf16 1024 (the case)", fn -> T.dot(bfa, bfb) |> consume.() end)
row.("  piece: as_type bf16 -> f32 {1024,1024}", fn -> T.as_type(bfa, {:f, 32}) |> consume.() end)
{fa, fb} = {T.as_type(bfa, {:f, 32}), T.as_type(bfb, {:f, 32})}
row.("  ref: dot f32 1024", fn -> T.dot(fa, fb) |> consume.() end)

IO.puts("\nload average at end: #{load.()}")
