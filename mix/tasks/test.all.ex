defmodule Mix.Tasks.Test.All do
  @shortdoc "Runs every test this environment can run, stage by stage, with a summary"
  @moduledoc """
  Runs the project's test stages in order and prints a summary with each stage's counts and
  time. Every stage runs even when an earlier one fails; the task fails if any stage did.

      mix test.all [--skip STAGE[,STAGE]] [--only STAGE[,STAGE]]

  Stages:

    * `rust`: the Rust core's tests (`cargo test --release`, without the NIF layer: test
      binaries run outside the BEAM, which provides `enif_*`).
    * `rust_avx2`: the same tests as an x86-64-v3 CPU runs them: `scripts/without_avx512.sh`
      hides AVX-512 from every CPUID, so the kernels, the gemm crate and Burn's vector code take
      their AVX2 paths. It runs on x86-64 Linux CPUs with AVX-512 and CPUID faulting (on others
      the `rust` stage already runs the narrower code, or it cannot be hidden).
    * `exunit`: `mix test`, with the Nx-, Axon- and telemetry-tagged tests when those
      packages are dependencies.
    * `nx_suite`, `nx_suite_compiler`: Nx's own test suite through `ExBurn.Backend`, then
      through the backend and `ExBurn.Defn.Compiler` (`test/nx_suite/run.exs`). They need Nx
      as a dependency and a source checkout of Nx with its `test/` folder in `EXBURN_NX_PATH`.
    * `axon_suite`: Axon's own suite through the backend and compiler
      (`test/nx_suite/run_axon.exs`), with an Axon checkout in `EXBURN_AXON_PATH`.

  A stage whose requirements are missing is listed as skipped, with the reason. When
  `EXBURN_TEST_SUMMARY` names a file, the summary is appended to it too (`.ci/run` prints the
  stages of its several runs together).
  """
  use Mix.Task

  @stages [:rust, :rust_avx2, :exunit, :nx_suite, :nx_suite_compiler, :axon_suite]

  @impl true
  def run(args) do
    {opts, _} = OptionParser.parse!(args, strict: [skip: :keep, only: :keep])
    wanted = selected(opts)
    Mix.Task.run("compile")

    results =
      for stage <- wanted do
        case requirement(stage) do
          :ok -> timed(stage)
          {:skip, why} -> {stage, :skipped, why, 0, []}
        end
      end

    summary = summary(results)
    Mix.shell().info(summary)

    case System.get_env("EXBURN_TEST_SUMMARY") do
      path when path in [nil, ""] -> :ok
      path -> File.write!(path, summary <> "\n", [:append])
    end

    failed = for {stage, :failed, _, _, _} <- results, do: stage
    if failed != [], do: Mix.raise("test.all: stages failed: #{Enum.join(failed, ", ")}")
  end

  @doc false
  def selected(opts) do
    parse = fn key -> opts |> Keyword.get_values(key) |> Enum.flat_map(&String.split(&1, ",")) end
    names = Map.new(@stages, &{Atom.to_string(&1), &1})

    to_stage = fn name ->
      Map.get(names, name) ||
        Mix.raise("test.all: unknown stage #{inspect(name)}; stages: #{Enum.join(@stages, ", ")}")
    end

    only = Enum.map(parse.(:only), to_stage)
    skip = Enum.map(parse.(:skip), to_stage)
    Enum.filter(@stages, &((only == [] or &1 in only) and &1 not in skip))
  end

  defp requirement(stage) when stage in [:rust, :exunit], do: :ok

  defp requirement(:rust_avx2) do
    flags =
      case File.read("/proc/cpuinfo") do
        {:ok, text} ->
          Regex.run(~r/^flags\s*:(.*)$/m, text, capture: :all_but_first)
          |> List.wrap()
          |> Enum.flat_map(&String.split/1)

        {:error, _} ->
          []
      end

    cond do
      "avx512f" not in flags ->
        {:skip, "no AVX-512 on this CPU (the rust stage runs its widest code, AVX2 or narrower)"}

      "cpuid_fault" not in flags ->
        {:skip, "this CPU (or its hypervisor) has no CPUID faulting to hide AVX-512 with"}

      System.find_executable("cc") == nil ->
        {:skip, "no C compiler (cc) for scripts/cpuid_mask.c"}

      true ->
        :ok
    end
  end

  defp requirement(stage) when stage in [:nx_suite, :nx_suite_compiler],
    do: suite_requirement(:nx, "EXBURN_NX_PATH")

  defp requirement(:axon_suite), do: suite_requirement(:axon, "EXBURN_AXON_PATH")

  defp suite_requirement(dep, env) do
    path = System.get_env(env)

    cond do
      not Map.has_key?(Mix.Project.deps_paths(), dep) ->
        {:skip, "#{dep} is not a dependency (mix deps.get with Hex, or scripts/nx-stack.sh)"}

      path in [nil, ""] or not File.dir?(Path.join(path, "test")) ->
        {:skip, "#{env} does not name a #{dep} source checkout with its test/ folder"}

      true ->
        :ok
    end
  end

  defp timed(stage) do
    Mix.shell().info(IO.ANSI.format([:bright, "==> test.all: #{stage}"]))
    started = System.monotonic_time(:millisecond)
    {status, output} = run_stage(stage)
    seconds = div(System.monotonic_time(:millisecond) - started, 1000)
    verdict = if status == 0, do: :passed, else: :failed
    {stage, verdict, counts(stage, output, status), seconds, failures(stage, output)}
  end

  defp run_stage(:rust), do: command(cargo(), cargo_test(), cargo_env())

  defp run_stage(:rust_avx2),
    do: command(Path.expand("scripts/without_avx512.sh"), [cargo() | cargo_test()], cargo_env())

  defp run_stage(:exunit), do: mix(["test"], [])
  defp run_stage(:nx_suite), do: mix(["run", "test/nx_suite/run.exs"], suite_env())
  defp run_stage(:nx_suite_compiler), do: mix(["run", "test/nx_suite/run.exs", "--compiler"], suite_env())
  defp run_stage(:axon_suite), do: mix(["run", "test/nx_suite/run_axon.exs"], suite_env())

  defp cargo,
    do: System.find_executable("cargo") || Mix.raise("cargo not found in PATH (Rust >= 1.85 is required)")

  defp cargo_test, do: ["test", "--release", "-p", "ex_burn", "--no-default-features"]
  defp cargo_env, do: [{"CARGO_TARGET_DIR", Mix.Tasks.Compile.ExBurnNative.target_dir()}]

  # Nx's and Axon's test support define protocol implementations at run time (mix.exs leaves
  # protocols unconsolidated under this variable)
  defp suite_env, do: [{"EXBURN_NX_SUITE", "1"}]

  defp mix(args, env) do
    mix = System.find_executable("mix") || Mix.raise("mix not found in PATH")
    command(mix, args, [{"MIX_ENV", Atom.to_string(Mix.env())} | env])
  end

  # Streams the command's output as it comes and keeps it for the counts.
  defp command(exe, args, env) do
    Mix.shell().info("==> " <> Enum.join([Path.basename(exe) | args], " "))
    env = for {k, v} <- env, do: {String.to_charlist(k), String.to_charlist(v)}
    opts = [:binary, :exit_status, :stderr_to_stdout, args: args, env: env]
    collect(Port.open({:spawn_executable, exe}, opts), [])
  end

  defp collect(port, kept) do
    receive do
      {^port, {:data, chunk}} ->
        IO.write(chunk)
        collect(port, [kept | chunk])

      {^port, {:exit_status, status}} ->
        {status, IO.iodata_to_binary(kept)}
    end
  end

  @doc false
  # A stage's counts, read off its output (public for the tests).
  def counts(stage, output, status)

  def counts(stage, output, status) when stage in [:rust, :rust_avx2] do
    totals =
      Regex.scan(~r/test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored/, output)
      |> Enum.reduce({0, 0, 0}, fn [_ | n], {p, f, i} ->
        [a, b, c] = Enum.map(n, &String.to_integer/1)
        {p + a, f + b, i + c}
      end)

    case totals do
      {0, 0, 0} -> "no test results (exit #{status})"
      {p, f, i} -> "#{p} passed, #{f} failed, #{i} ignored"
    end
  end

  def counts(:exunit, output, status) do
    line = last_match(~r/^\d+ doctests?, \d+ tests?, .*$|^\d+ tests?, \d+ failures?.*$/m, output)
    label = if Map.has_key?(Mix.Project.deps_paths(), :nx), do: "with Nx: ", else: "without Nx: "
    label <> (line || "no ExUnit result (exit #{status})")
  end

  def counts(_suite, output, status) do
    line = last_match(~r/^.*through ExBurn.*: (\d+ run, \d+ pass, \d+ fail)$/m, output, 1)
    explained = if status == 0, do: "every failure explained", else: "unexplained failures or a crash"
    if line, do: "#{line}, #{explained}", else: "no suite result (exit #{status})"
  end

  @doc false
  # The first failing tests of a stage's output, a few lines each, so that the summary (the end of
  # a CI log, often all that is kept of it) names what failed and why (public for the tests).
  def failures(stage, output, limit \\ 5)

  def failures(stage, output, limit) when stage in [:rust, :rust_avx2] do
    ~r/^---- (\S+) stdout ----\n(?:.*\n){0,3}?.*panicked at ([^\n]*)\n([^\n]*)/m
    |> Regex.scan(output, capture: :all_but_first)
    |> Enum.take(limit)
    |> Enum.map(fn [name, at, message] -> "#{name}: #{String.slice(message, 0, 300)} (#{at})" end)
  end

  def failures(:exunit, output, limit) do
    output |> exunit_failures() |> Enum.take(limit) |> Enum.map(&elem(&1, 1))
  end

  # A suite's unexplained failures, as its verdict names them, each with its ExUnit detail.
  def failures(_suite, output, limit) do
    case Regex.run(~r/^ +\d+ unexplained: .*\n((?: {6}\S.*(?:\n|$))*)/m, output, capture: :all_but_first) do
      [listed] ->
        details = Map.new(exunit_failures(output))

        listed
        |> String.split("\n", trim: true)
        |> Enum.take(limit)
        |> Enum.map(fn line ->
          [module, name] = line |> String.trim() |> String.split(": ", parts: 2)
          test = "#{name} (#{module})"
          Map.get(details, test, test)
        end)

      nil ->
        []
    end
  end

  # `{name, "name at file:line: detail"}` for each failure ExUnit printed
  defp exunit_failures(output) do
    ~r/^ +\d+\) (.+)\n +(\S+:\d+)\n((?: {5}.*\n){0,6})/m
    |> Regex.scan(output, capture: :all_but_first)
    |> Enum.map(fn [name, at, detail] ->
      detail = detail |> String.split("\n", trim: true) |> Enum.map_join(" | ", &String.trim/1)
      {name, "#{name} at #{at}: #{String.slice(detail, 0, 400)}"}
    end)
  end

  defp last_match(regex, output, group \\ 0) do
    case Regex.scan(regex, output) do
      [] -> nil
      found -> found |> List.last() |> Enum.at(group) |> String.trim()
    end
  end

  defp summary(results) do
    width = @stages |> Enum.map(&String.length(Atom.to_string(&1))) |> Enum.max()

    rows =
      for {stage, verdict, text, seconds, failures} <- results do
        name = String.pad_trailing(Atom.to_string(stage), width)
        time = if verdict == :skipped, do: "", else: " (#{seconds} s)"
        row = "  #{name}  #{String.pad_trailing(Atom.to_string(verdict), 7)}  #{text}#{time}"
        Enum.join([row | Enum.map(failures, &"      failed: #{&1}")], "\n")
      end

    Enum.join(["test.all summary (Elixir #{System.version()}, MIX_ENV=#{Mix.env()}):" | rows], "\n")
  end
end
