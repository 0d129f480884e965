# NIF tax: the same ops through ExBurn.Tensor (Elixir -> NIF -> Burn) and timed inside Rust by
# the crate's `burn_bench` example (Burn directly, no NIF boundary), run from here.
#
#   mix run bench/nif_tax.exs [iterations]
#
# Forcing the result: each Elixir iteration reads back ONE element with to_binary(result, 1).
# flex (CPU) executes eagerly, so the op has completed when the NIF returns; reading one element
# keeps the measurement honest on lazy/async devices without charging a full copy to Elixir.
alias ExBurn.Tensor, as: T

iters =
  case System.argv() do
    [n | _] -> String.to_integer(n)
    [] -> 50
  end

time_us = fn fun ->
  # one warm-up call, then the mean over `iters`
  fun.()
  {us, _} = :timer.tc(fn -> for _ <- 1..iters, do: fun.() end)
  us / iters
end

n = 1_000_000
a = T.iota({n}, :f32)
b = T.ones({n}, :f32)
k = 1024
ma = T.iota({k, k}, :f32) |> T.divide(k * k)
mb = T.ones({k, k}, :f32)

# The Rust loop frees each result at once, so its allocator hands the same (already mapped)
# buffer back every time. Through the NIF a result lives until the BEAM collects its handle; the
# "+ deallocate" rows free it explicitly, as a loop that cares about memory would, and separate
# the cost of the boundary from the cost of fresh memory.
force_and_free = fn t ->
  T.to_binary(t, 1)
  T.deallocate(t)
end

rows = [
  {"add f32[#{n}]", fn -> T.add(a, b) |> T.to_binary(1) end, {:add, n}},
  {"add + deallocate", fn -> T.add(a, b) |> force_and_free.() end, {:add, n}},
  {"matmul f32[#{k}x#{k}]", fn -> T.dot(ma, mb) |> T.to_binary(1) end, {:matmul, k}},
  {"matmul + deallocate", fn -> T.dot(ma, mb) |> force_and_free.() end, {:matmul, k}}
]

IO.puts("iterations: #{iters}, device: #{inspect(ExBurn.default_device())}\n")

IO.puts(
  String.pad_trailing("op", 24) <>
    String.pad_leading("NIF µs/iter", 14) <>
    String.pad_leading("Rust µs/iter", 14) <> String.pad_leading("ratio", 8)
)

# The Rust peer is a cargo example outside the shipped library (built on first use).
rust_ns = fn op, size ->
  args =
    ~w(run --release -q -p ex_burn --no-default-features --example burn_bench -- peer) ++
      [to_string(op), to_string(size), to_string(iters)]

  env = [{"CARGO_TARGET_DIR", Mix.Tasks.Compile.ExBurnNative.target_dir()}]
  {out, 0} = System.cmd("cargo", args, env: env)
  out |> String.trim() |> String.split("\n") |> List.last() |> Float.parse() |> elem(0)
end

for {label, fun, {op, size}} <- rows do
  nif_us = time_us.(fun)
  rust_ns = rust_ns.(op, size)
  rust_us = rust_ns / 1000

  IO.puts(
    String.pad_trailing(label, 24) <>
      String.pad_leading(:erlang.float_to_binary(nif_us, decimals: 1), 14) <>
      String.pad_leading(:erlang.float_to_binary(rust_us, decimals: 1), 14) <>
      String.pad_leading(:erlang.float_to_binary(nif_us / rust_us, decimals: 2), 8)
  )
end
