defmodule ExBurn.Bench do
  @moduledoc """
  The benchmark suites behind `mix ex_burn.bench`: each suite times ExBurn cases per engine and
  device, optionally runs the Python reference implementations in the same invocation, and the
  results are written as raw JSON and a self-contained HTML report (`ExBurn.Bench.Report`).

  Suites:

    * `:embed` - sentence embeddings (`ExBurn.Embedding`, all-MiniLM-L6-v2): throughput at
      batch 32 (embeddings/s) and batch-1 latency, per engine and device
    * `:llm` - generation (`ExBurn.LLM`, SmolLM2-135M-Instruct): greedy tokens/s, per engine and
      device
    * `:ops` - tensor ops (`ExBurn.Tensor`) per device
    * `:train` - one `ExBurn.Model.fit` epoch of an MLP per device (samples/s)

  With `compare: :python` the references run after ExBurn's cases (never at the same time, so
  they do not share cores): sentence-transformers, transformers and PyTorch on the CPU, with as
  many threads as the BEAM has schedulers. Missing Python packages or models skip a case with a
  note; they never fail the run.

  Timing: one warm-up call, then `:iterations` timed calls; a case reports every sample (ms),
  p50/p90/p99 and a throughput from the median. No assertion is made on any time.
  """

  @suites [:embed, :llm, :ops, :train]

  @doc "The suites, in the order they run."
  def suites, do: @suites

  @doc """
  Runs `suites` and returns the results map (what `ExBurn.Bench.Report` renders and the JSON
  holds): `%{environment: map, cases: [case], notes: [binary]}`.

  Options: `:iterations` (default 10), `:devices` (device specs, default the default device),
  `:engines` (default `[:burn, :candle]`), `:compare` (`:python` or nil), `:dir` (models
  directory), `:progress` (a function of `{done, total, label}`, called before each case).
  """
  def run(suites, opts \\ []) do
    opts =
      Keyword.merge(
        [iterations: 10, engines: [:burn, :candle], compare: nil, progress: fn _ -> :ok end],
        opts
      )

    opts =
      Keyword.put(
        opts,
        :devices,
        Enum.map(opts[:devices] || [ExBurn.default_device()], &ExBurn.Device.resolve/1)
      )

    plans = Enum.flat_map(suites, fn suite -> Enum.map(module(suite).plan(opts), &{suite, &1}) end)
    total = length(plans) + if(opts[:compare] == :python, do: 1, else: 0)

    {cases, notes} =
      plans
      |> Enum.with_index()
      |> Enum.reduce({[], []}, fn {{suite, plan}, i}, {cases, notes} ->
        opts[:progress].({i, total, "#{suite} #{plan.label}"})

        case module(suite).run(plan, opts) do
          {:ok, new} -> {cases ++ new, notes}
          {:skip, note} -> {cases, notes ++ ["#{suite} #{plan.label}: #{note}"]}
        end
      end)

    {cases, notes} =
      if opts[:compare] == :python do
        opts[:progress].({total - 1, total, "python references"})

        case ExBurn.Bench.Python.run(suites, opts) do
          {:ok, refs, py_notes} -> {cases ++ refs, notes ++ py_notes}
          {:skip, note} -> {cases, notes ++ ["python: " <> note]}
        end
      else
        {cases, notes}
      end

    opts[:progress].({total, total, "done"})
    %{environment: environment(opts), cases: cases, ratios: ratios(cases), notes: notes}
  end

  defp module(:embed), do: ExBurn.Bench.Embed
  defp module(:llm), do: ExBurn.Bench.LLM
  defp module(:ops), do: ExBurn.Bench.Ops
  defp module(:train), do: ExBurn.Bench.Train

  @doc """
  Times `fun` (one warm-up call, then `iterations` calls) and returns a case map with the
  samples in ms, the percentiles and `throughput = items / median seconds` in `unit`.
  """
  def measure(fields, iterations, items, unit, fun) do
    fun.()

    samples =
      for _ <- 1..iterations do
        {us, _} = :timer.tc(fun)
        us / 1000
      end

    case_map(fields, samples, items, unit)
  end

  @doc "A case map from samples in ms (also used for the Python references)."
  def case_map(fields, samples, items, unit) do
    p50 = percentile(samples, 50)

    Map.merge(fields, %{
      samples_ms: samples,
      p50_ms: p50,
      p90_ms: percentile(samples, 90),
      p99_ms: percentile(samples, 99),
      throughput: if(p50 > 0, do: items / (p50 / 1000), else: nil),
      unit: unit
    })
  end

  @doc "The `p`th percentile (nearest rank) of `samples`."
  def percentile(samples, p) do
    sorted = Enum.sort(samples)
    rank = max(ceil(p / 100 * length(sorted)), 1)
    Enum.at(sorted, rank - 1)
  end

  # ExBurn vs the Python reference of the same suite and case, as time per item from the
  # medians (the time ratio when both did the same work; generation may stop at different
  # lengths): < 1 means ExBurn is faster.
  defp ratios(cases) do
    refs = for %{engine: "python"} = c <- cases, into: %{}, do: {{c.suite, c.case}, c}

    for c <- cases,
        c.engine != "python",
        ref = refs[{c.suite, c.case}],
        ref != nil,
        c.throughput,
        ref.throughput do
      %{
        suite: c.suite,
        case: c.case,
        engine: c.engine,
        device: c.device,
        reference: ref.implementation,
        exburn_ms: c.p50_ms,
        reference_ms: ref.p50_ms,
        ratio: ref.throughput / c.throughput
      }
    end
  end

  @doc "What the report shows about the machine and the build."
  def environment(opts) do
    %{
      cpu: cpu_model(),
      cores: System.schedulers_online(),
      load_average: load_average(),
      devices: Enum.map(ExBurn.devices(), &"#{&1.kind}:#{&1.index} #{&1.name}"),
      benchmarked_devices: Enum.map(opts[:devices], &ExBurn.Device.format/1),
      compiled_backends: Enum.map(ExBurn.Device.compiled_kinds(), &to_string/1),
      elixir: System.version(),
      otp: System.otp_release(),
      ex_burn: to_string(Application.spec(:ex_burn, :vsn) || "dev"),
      burn: "0.22.1",
      candle: "0.9.2",
      iterations: opts[:iterations],
      date: DateTime.utc_now() |> DateTime.truncate(:second) |> DateTime.to_iso8601()
    }
  end

  defp cpu_model do
    with {:ok, text} <- File.read("/proc/cpuinfo"),
         [_, name] <- Regex.run(~r/model name\s*:\s*(.+)/, text) do
      String.trim(name)
    else
      _ -> to_string(:erlang.system_info(:system_architecture))
    end
  end

  @doc "The 1, 5 and 15 minute load averages (\"n/a\" where /proc is absent)."
  def load_average do
    case File.read("/proc/loadavg") do
      {:ok, text} -> text |> String.split() |> Enum.take(3) |> Enum.join(" ")
      _ -> "n/a"
    end
  end
end
