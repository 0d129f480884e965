# One training epoch of an MLP 784-256-128-10 on 60_000 synthetic samples (batch 128) on the CPU
# through ExBurn.Model (Burn autodiff + Adam inside the NIF), printing samples/s. When Axon is
# loaded, the same model, data, loss and optimizer also go through Axon.Loop compiled by ExBurn
# (`compiler: ExBurn`, ExBurn.Backend tensors: the whole epoch) and on Nx.BinaryBackend (a few
# batches), and the ratios are printed; otherwise the peers are reported as skipped.
#
#   mix run bench/mlp_epoch.exs
#
# EXBURN_BENCH_AXON_BATCHES (default 20) bounds the Axon peer: BinaryBackend is pure Elixir and
# a full epoch takes hours, so its samples/s comes from that many batches of the same epoch.
alias ExBurn.{Model, Tensor}

n = 60_000
features = 784
classes = 10
batch = 128
device = {:cpu, 0}

# Deterministic synthetic data, made on the Burn side: x = sin(0.37 * i) in [-1, 1], labels =
# argmax of the first 10 features (learnable, balanced enough).
x = Tensor.iota({n, features}, :f32, device: device) |> Tensor.multiply(0.37) |> Tensor.sin()
y = x |> Tensor.slice([0, 0], [n, classes]) |> Tensor.argmax(axis: 1) |> Tensor.as_type(:s64)

model =
  Model.input({nil, features})
  |> Model.dense(256, activation: :relu)
  |> Model.dense(128, activation: :relu)
  |> Model.dense(classes)
  |> Model.compile(loss: :cross_entropy, optimizer: :adam, learning_rate: 1.0e-3, device: device)

IO.puts(
  "load average at start: #{File.read!("/proc/loadavg") |> String.split() |> Enum.take(3) |> Enum.join(" ")}"
)

IO.puts(
  "MLP 784-256-128-10 (#{Model.summary(model).params} params), #{n} samples, batch #{batch}, #{inspect(device)}"
)

# warm-up on a slice (allocator, kernels)
warm = Tensor.slice(x, [0, 0], [1024, features])
Model.fit(model, {warm, Tensor.slice(y, [0], [1024])}, epochs: 1, batch_size: batch)

{us, {_model, [%{loss: loss}]}} =
  :timer.tc(fn -> Model.fit_with_history(model, {x, y}, epochs: 1, batch_size: batch) end)

exburn_rate = n / (us / 1.0e6)

IO.puts(
  "ExBurn.Model (Burn flex CPU): one epoch in #{Float.round(us / 1.0e6, 2)} s, " <>
    "#{round(exburn_rate)} samples/s, mean loss #{Float.round(loss, 4)}"
)

if Code.ensure_loaded?(Axon) and Code.ensure_loaded?(Nx) do
  axon =
    Axon.input("input", shape: {nil, features})
    |> Axon.dense(256, activation: :relu)
    |> Axon.dense(128, activation: :relu)
    |> Axon.dense(classes, activation: :softmax)

  trainer = fn ->
    optimizer = Polaris.Optimizers.adam(learning_rate: 1.0e-3)
    Axon.Loop.trainer(axon, :categorical_cross_entropy, optimizer, log: 0)
  end

  # Axon compiled by ExBurn: the epoch's data as ExBurn.Backend tensors, one-hot targets
  Nx.default_backend(ExBurn.Backend)
  bx = Nx.from_binary(Tensor.to_binary(x), :f32) |> Nx.reshape({n, features})

  by =
    Nx.from_binary(Tensor.to_binary(y), :s64)
    |> Nx.new_axis(-1)
    |> Nx.equal(Nx.iota({1, classes}))
    |> Nx.as_type(:f32)

  full = Enum.zip(Nx.to_batched(bx, batch), Nx.to_batched(by, batch))
  # warm-up: compiles the step programs
  Axon.Loop.run(trainer.(), Enum.take(full, 8), Axon.ModelState.empty(), epochs: 1, compiler: ExBurn)

  {compiled_us, _state} =
    :timer.tc(fn -> Axon.Loop.run(trainer.(), full, Axon.ModelState.empty(), epochs: 1, compiler: ExBurn) end)

  compiled_rate = n / (compiled_us / 1.0e6)

  IO.puts(
    "Axon.Loop compiled by ExBurn (ExBurn.Backend): one epoch in #{Float.round(compiled_us / 1.0e6, 2)} s, " <>
      "#{round(compiled_rate)} samples/s"
  )

  IO.puts(
    "time ratio ExBurn.Model.fit / Axon compiled by ExBurn: #{Float.round(us / compiled_us, 2)} (< 1: native fit faster)"
  )

  batches = String.to_integer(System.get_env("EXBURN_BENCH_AXON_BATCHES") || "20")
  Nx.default_backend(Nx.BinaryBackend)
  rows = batches * batch

  nx_x =
    Nx.from_binary(Tensor.to_binary(Tensor.slice(x, [0, 0], [rows, features])), :f32)
    |> Nx.reshape({rows, features})

  labels = Tensor.slice(y, [0], [rows]) |> Tensor.to_flat_list()
  nx_y = Nx.tensor(labels) |> Nx.new_axis(-1) |> Nx.equal(Nx.iota({1, classes})) |> Nx.as_type(:f32)
  data = Enum.zip(Nx.to_batched(nx_x, batch), Nx.to_batched(nx_y, batch))

  loop = trainer.()

  {axon_us, _state} = :timer.tc(fn -> Axon.Loop.run(loop, data, Axon.ModelState.empty(), epochs: 1) end)
  axon_rate = rows / (axon_us / 1.0e6)

  IO.puts(
    "Axon.Loop on Nx.BinaryBackend: #{batches} batches (#{rows} samples) in #{Float.round(axon_us / 1.0e6, 2)} s, #{Float.round(axon_rate, 1)} samples/s"
  )

  IO.puts("ratio ExBurn / Axon+BinaryBackend: #{Float.round(exburn_rate / axon_rate, 1)}x")
else
  missing = Enum.reject([Axon, Nx, Polaris], &Code.ensure_loaded?/1) |> Enum.map_join(", ", &inspect/1)

  IO.puts(
    "Axon peer skipped: #{missing} not loaded (optional dependencies; Hex unreachable here or not fetched)"
  )
end

IO.puts(
  "load average at end: #{File.read!("/proc/loadavg") |> String.split() |> Enum.take(3) |> Enum.join(" ")}"
)
