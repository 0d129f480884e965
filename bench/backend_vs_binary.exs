# ExBurn.Backend vs Nx.BinaryBackend on the same inputs, in one run.
#
#   mix run bench/backend_vs_binary.exs          (needs Nx: Hex, EXBURN_NX_PATH or EXBURN_LOCAL_DEPS)
#
# Each op is timed on both backends (results read back to the host, so lazy devices are
# measured too); the ratio is BinaryBackend time / ExBurn time (higher is better for ExBurn).
if Code.ensure_loaded?(Nx) do
  defmodule BackendBench do
    # Repeats `fun` until 0.3 s have passed (at most 50 times); mean microseconds. A first run
    # slower than that is the measurement itself (BinaryBackend's dot takes minutes).
    def time(fun) do
      {first, _} = :timer.tc(fun)
      if first > 300_000, do: throw({:slow, first})
      start = System.monotonic_time(:microsecond)

      Stream.iterate(1, &(&1 + 1))
      |> Enum.reduce_while(nil, fn n, _ ->
        fun.()
        elapsed = System.monotonic_time(:microsecond) - start
        if elapsed > 300_000 or n >= 50, do: {:halt, elapsed / n}, else: {:cont, nil}
      end)
    catch
      {:slow, us} -> us * 1.0
    end

    def inputs(backend) do
      key = Nx.Random.key(42)
      {a, key} = Nx.Random.uniform(key, shape: {512, 512})
      {b, key} = Nx.Random.uniform(key, shape: {512, 512})
      {img, key} = Nx.Random.uniform(key, shape: {1, 3, 64, 64})
      {k, _key} = Nx.Random.uniform(key, shape: {8, 3, 3, 3})
      Map.new([a: a, b: b, img: img, k: k], fn {n, t} -> {n, Nx.backend_copy(t, backend)} end)
    end

    def run do
      ops = [
        {"add {512,512} f32", fn x -> Nx.add(x.a, x.b) end},
        {"exp {512,512} f32", fn x -> Nx.exp(x.a) end},
        {"sum {512,512} f32", fn x -> Nx.sum(x.a) end},
        {"dot 512x512 f32", fn x -> Nx.dot(x.a, x.b) end},
        {"conv {1,3,64,64}*{8,3,3,3}", fn x -> Nx.conv(x.img, x.k, padding: :same) end},
        {"conv strided, dilated",
         fn x -> Nx.conv(x.img, x.k, strides: 2, kernel_dilation: 2, padding: :same) end},
        {"window_sum {1,3,64,64} 3x3", fn x -> Nx.window_sum(x.img, {1, 1, 3, 3}, padding: :same) end},
        {"window_max {1,3,64,64} 2x2/2",
         fn x -> Nx.window_max(x.img, {1, 1, 2, 2}, strides: [1, 1, 2, 2]) end},
        {"argsort {512,512} axis 1", fn x -> Nx.argsort(x.a, axis: 1) end}
      ]

      burn = inputs(ExBurn.Backend)
      host = inputs(Nx.BinaryBackend)
      read = fn r -> Nx.to_binary(r) end

      IO.puts(
        String.pad_trailing("op", 30) <>
          String.pad_leading("ExBurn us", 12) <>
          String.pad_leading("Binary us", 14) <> String.pad_leading("ratio", 10)
      )

      for {name, fun} <- ops do
        ExBurn.Backend.Fallback.reset()
        tb = time(fn -> read.(fun.(burn)) end)
        fell_back = ExBurn.Backend.Fallback.counts()
        th = time(fn -> read.(fun.(host)) end)
        note = if fell_back == %{}, do: "", else: "  (fallback: #{inspect(Map.keys(fell_back))})"

        IO.puts(
          String.pad_trailing(name, 30) <>
            String.pad_leading(:erlang.float_to_binary(tb, decimals: 0), 12) <>
            String.pad_leading(:erlang.float_to_binary(th, decimals: 0), 14) <>
            String.pad_leading(:erlang.float_to_binary(th / tb, decimals: 1) <> "x", 10) <> note
        )
      end
    end
  end

  BackendBench.run()
else
  IO.puts("bench/backend_vs_binary.exs skipped: Nx is not available (set EXBURN_NX_PATH or install Hex deps)")
end
