Code.require_file("support/pretrained_case.exs", __DIR__)
Code.require_file("support/doc_examples.exs", __DIR__)
Code.require_file("support/nx_compare.exs", __DIR__)
# Tests tagged :nx / :axon / :telemetry need those optional dependencies (from Hex, or local
# checkouts); they are excluded when the module is not loaded.
exclude =
  for {tag, module} <- [nx: Nx, axon: Axon, telemetry: :telemetry], not Code.ensure_loaded?(module), do: tag

# Tests of what :auto does in a CPU-only build, and in one with a GPU backend compiled in.
build = if ExBurn.Device.compiled_kinds() == [:cpu], do: :gpu_build, else: :cpu_only_build

# On a GPU every kernel is compiled the first time it runs, and a small LSTM's first epoch
# compiles a few hundred of them: minutes where the CPU takes under a second (guides/devices.md).
# Tests keep ExUnit's 60 s limit on the CPU and get 10 minutes on a GPU.
timeout = if elem(ExBurn.default_device(), 0) == :cpu, do: 60_000, else: 600_000
# A test's engine does not hang on a timing: `:auto` keeps Burn first unless a test turns the
# measured choice on (ExBurn.Pretrained.EngineChoiceTest, PretrainedCase.assert_auto_measures/2).
if System.get_env("EXBURN_ENGINE_CHOICE") in [nil, ""],
  do: System.put_env("EXBURN_ENGINE_CHOICE", "burn_first")

ExUnit.start(exclude: [build | exclude], timeout: timeout)

defmodule ExBurn.TestHelpers do
  @moduledoc false
  import ExUnit.Assertions
  alias ExBurn.Tensor
  @compile {:no_warn_undefined, :telemetry}

  @doc """
  The relative bound for results of products computed two ways on the default device: `cpu` on
  the CPU (f32 rounding, the same bits call after call at 0.0), 2.0e-3 on a GPU, whose dense
  layers run TF32 kernels (about 5e-4 relative) and whose autotuning may pick another kernel per
  run.
  """
  def product_tolerance(cpu \\ 0.0), do: if(ExBurn.default_device() == {:cpu, 0}, do: cpu, else: 2.0e-3)

  @doc """
  How long a test gives a serving call: the serving's own 5 s default on the CPU, two minutes on
  a GPU, where the first batch of each new shape compiles its kernels (seconds each, longer while
  other tests compile theirs).
  """
  def call_timeout, do: if(ExBurn.default_device() == {:cpu, 0}, do: 5_000, else: 120_000)

  @doc """
  Runs `fun` with a handler of the telemetry `event` attached that sends the test process
  `{ref, event, measurements, metadata}`; the handler is detached afterwards, whatever happens.
  """
  def with_telemetry(event, ref, fun) do
    parent = self()
    id = "exburn-test-#{inspect(ref)}"
    :telemetry.attach(id, event, fn e, m, meta, _ -> send(parent, {ref, e, m, meta}) end, nil)

    try do
      fun.()
    after
      :telemetry.detach(id)
    end
  end

  def t(data, type), do: Tensor.tensor(data, type: type)

  @doc "Polls `fun` every 10 ms until it returns true; fails the test after `tries` polls."
  def wait_until(fun, tries \\ 300) do
    cond do
      fun.() -> :ok
      tries == 0 -> flunk("condition never held")
      true -> Process.sleep(10) && wait_until(fun, tries - 1)
    end
  end

  def list(tensor), do: Tensor.to_flat_list(tensor)

  @doc "Asserts shape, type and exact element values."
  def assert_tensor(tensor, shape, type, values) do
    assert {Tensor.shape(tensor), Tensor.type(tensor)} == {shape, ExBurn.Type.normalize(type)}
    assert list(tensor) == values
    tensor
  end

  @doc "Asserts shape, type and float values within `delta` (non-finite atoms must match exactly)."
  def assert_close(tensor, shape, type, values, delta \\ 1.0e-5) do
    assert {Tensor.shape(tensor), Tensor.type(tensor)} == {shape, ExBurn.Type.normalize(type)}
    got = list(tensor)
    assert length(got) == length(values), "expected #{inspect(values)}, got #{inspect(got)}"

    for {g, e} <- Enum.zip(got, values) do
      if is_atom(e) or is_atom(g),
        do: assert(g == e, "expected #{inspect(values)}, got #{inspect(got)}"),
        else: assert_in_delta(g, e, delta, "expected #{inspect(values)}, got #{inspect(got)}")
    end

    tensor
  end
end

defmodule ExBurn.ModelTestData do
  @moduledoc false
  # Deterministic synthetic data sets for the model tests.

  @doc "The small MLP the serving tests serve: 4 features -> 16 tanh -> 3, seeded."
  def serving_mlp do
    ExBurn.Model.input({nil, 4})
    |> ExBurn.Model.dense(16, activation: :tanh)
    |> ExBurn.Model.dense(3)
    |> ExBurn.Model.compile(seed: 3)
  end

  @doc "Request `i`'s input row for `serving_mlp/0` (distinct rows, deterministic)."
  def serving_input(i), do: [rem(i, 7) / 7, rem(i, 5) - 2.0, i / 10_000, 1.0]

  def xor, do: {[[0, 0], [0, 1], [1, 0], [1, 1]], [0, 1, 1, 0]}

  @doc "`n` points around `classes` Gaussian centers in `dims` dimensions: `{x_rows, labels}`."
  def blobs(n, classes, dims, seed \\ 7) do
    :rand.seed(:exsss, {seed, seed * 3 + 1, seed * 7 + 2})
    centers = for _ <- 1..classes, do: for(_ <- 1..dims, do: (:rand.uniform() - 0.5) * 8.0)

    Enum.map(0..(n - 1), fn i ->
      label = rem(i, classes)
      center = Enum.at(centers, label)
      {Enum.map(center, &(&1 + :rand.normal())), label}
    end)
    |> Enum.unzip()
  end

  @doc "Fraction of rows of `predictions` whose argmax is the label."
  def accuracy(predictions, labels) do
    got = predictions |> ExBurn.Tensor.argmax(axis: 1) |> ExBurn.Tensor.to_flat_list()
    Enum.count(Enum.zip(got, labels), fn {a, b} -> a == b end) / length(labels)
  end
end
