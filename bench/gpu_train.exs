# Training on a device through ExBurn.Model, epoch by epoch, with PyTorch's figures for the same
# models on the same device when `bench/gpu_train_peer.py` runs in the same invocation:
#
#   EXBURN_BENCH_DEVICE=cuda mix run bench/gpu_train.exs [mlp] [lstm] [gru]
#   python3 bench/gpu_train_peer.py cuda [mlp] [lstm] [gru]
#
# (EXBURN_BENCH_DEVICE defaults to the CPU, as in bench/pretrained.exs; the peer takes its device
# as its first argument and EXBURN_BENCH_TORCH_THREADS threads on the CPU.)
#
# Models (the peer builds the same layers, loss, optimizer, batch and data):
#   mlp   784-256-128-10, ReLU, softmax cross-entropy, Adam 1e-3, batch 128, 60 000 samples
#   lstm  tokens (32 a sample, vocabulary 1000) -> embedding 64 -> LSTM 128 (every step) ->
#         LSTM 64 (last step) -> dense 2; Adam 1e-3, batch 64, 8 192 samples
#   gru   the same with GRU layers
#
# EXBURN_BENCH_PROBE="1 2 8 32" first fits each model on that many batches, printing each fit's
# time as it ends (the probe's steps train the model the epochs then time).
#
# Each model runs EXBURN_BENCH_EPOCHS (default 4) epochs in this process and prints every
# epoch's seconds: the first one includes compiling the device's kernels, unless the kernel
# cache (EXBURN_KERNEL_CACHE, CUDA builds) already holds them from an earlier process, so run it
# once with an empty cache and once more to see a cold and a warm process. "steady" is the
# median of the epochs after the first; "step" is that over the epoch's batches.
Code.require_file("support/machine.exs", __DIR__)
alias ExBurn.{Model, Tensor}

defmodule GpuTrain do
  def device, do: ExBurn.Device.resolve(System.get_env("EXBURN_BENCH_DEVICE") || "cpu")

  def epochs, do: String.to_integer(System.get_env("EXBURN_BENCH_EPOCHS") || "4")

  # x = sin(0.37 * i) over the features (iota in f32), label = argmax of the first 10, made on the
  # device as bench/mlp_epoch.exs makes them
  def mlp_data(n, features, classes) do
    x = Tensor.iota({n, features}, :f32, device: device()) |> Tensor.multiply(0.37) |> Tensor.sin()
    y = x |> Tensor.slice([0, 0], [n, classes]) |> Tensor.argmax(axis: 1) |> Tensor.as_type(:s64)
    {x, y}
  end

  # token (i, j) from a fixed linear congruence; label: whether the sample's first token is even
  def token_data(n, len, vocab) do
    tokens =
      for i <- 0..(n - 1), j <- 0..(len - 1), into: <<>> do
        <<rem(i * 7919 + j * 104_729 + div(i * j, 13), vocab)::signed-64-native>>
      end

    labels = for i <- 0..(n - 1), into: <<>>, do: <<rem(rem(i * 7919, vocab), 2)::signed-64-native>>

    {Tensor.from_binary(tokens, :s64, shape: {n, len}, device: device()),
     Tensor.from_binary(labels, :s64, shape: {n}, device: device())}
  end

  def model(:mlp) do
    spec =
      Model.input({nil, 784})
      |> Model.dense(256, activation: :relu)
      |> Model.dense(128, activation: :relu)
      |> Model.dense(10)

    {spec, mlp_data(60_000, 784, 10), 128}
  end

  def model(rnn) when rnn in [:lstm, :gru] do
    spec =
      Model.input({nil, 32}, type: :s64)
      |> Model.embedding(1000, 64)
      |> then(&apply(Model, rnn, [&1, 128, [return_sequences: true]]))
      |> then(&apply(Model, rnn, [&1, 64, [return_sequences: false]]))
      |> Model.dense(2)

    {spec, token_data(8192, 32, 1000), 64}
  end

  def run(name) do
    {data_us, {spec, {x, _y} = data, batch}} = :timer.tc(fn -> model(name) |> synced() end)
    {n, _} = Tensor.shape(x)
    steps = div(n + batch - 1, batch)

    {compile_us, model} =
      :timer.tc(fn ->
        Model.compile(spec, loss: :cross_entropy, optimizer: :adam, learning_rate: 1.0e-3, device: device())
      end)

    IO.puts("#{name}: data made in #{fmt(data_us / 1.0e6)} s")
    model = probe(name, model, data, batch)

    {secs, _model} =
      Enum.map_reduce(1..epochs(), model, fn _, m ->
        {us, {m, [%{loss: loss}]}} =
          :timer.tc(fn -> Model.fit_with_history(m, data, epochs: 1, batch_size: batch, shuffle: false) end)

        {{us / 1.0e6, loss}, m}
      end)

    [{first, _} | rest] = secs
    steady = rest |> Enum.map(&elem(&1, 0)) |> Enum.sort() |> Enum.at(div(length(rest), 2))

    IO.puts(
      "#{name} ExBurn #{ExBurn.Device.format(device())}: compile #{fmt(compile_us / 1.0e6)} s, " <>
        "epochs #{Enum.map_join(secs, " ", fn {s, _} -> fmt(s) end)} s (first #{fmt(first)}), " <>
        "steady #{fmt(steady)} s, step #{fmt(steady / steps * 1000)} ms, " <>
        "#{round(n / steady)} samples/s, last loss #{fmt(secs |> List.last() |> elem(1))} " <>
        "(#{n} samples, batch #{batch}, #{steps} steps)"
    )
  end

  def fmt(f), do: :erlang.float_to_binary(f / 1, decimals: 3)

  # the data's last label read back, so its time is the data's and not the first step's
  defp synced({_spec, {_x, y}, _batch} = made) do
    {n} = Tensor.shape(y)
    _ = y |> Tensor.slice([n - 1], [1]) |> Tensor.to_binary()
    made
  end

  # With EXBURN_BENCH_PROBE="1 2 8 32" (batch counts), fits on the first that many batches before
  # the epochs, each timed and printed as it ends: where a first epoch's time goes (kernels
  # compiled for the first batch, or every batch) shows before the epoch ends, or times out.
  defp probe(name, model, {x, y}, batch) do
    counts = System.get_env("EXBURN_BENCH_PROBE", "") |> String.split() |> Enum.map(&String.to_integer/1)
    {n, _} = Tensor.shape(x)

    Enum.reduce(counts, model, fn k, m ->
      rows = min(k * batch, n)

      part =
        {Tensor.slice(x, [0, 0], [rows | tl(Tuple.to_list(Tensor.shape(x)))]), Tensor.slice(y, [0], [rows])}

      {us, {m, _}} =
        :timer.tc(fn -> Model.fit_with_history(m, part, epochs: 1, batch_size: batch, shuffle: false) end)

      IO.puts("#{name} probe: #{div(rows + batch - 1, batch)} batches in #{fmt(us / 1.0e6)} s")
      m
    end)
  end
end

names =
  case System.argv() do
    [] -> [:mlp, :lstm, :gru]
    args -> Enum.map(args, &String.to_existing_atom/1)
  end

IO.puts("load average at start: #{Bench.Machine.loadavg()}")
Enum.each(names, &GpuTrain.run/1)
IO.puts("load average at end: #{Bench.Machine.loadavg()}")
