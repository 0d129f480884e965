# The machine a benchmark ran on, for its header and its results file's name. Figures from two
# CPUs don't compare: the peers (oneDNN/MKL, ggml) and ExBurn's kernels pick their code by the
# ISA flags below, so every benchmark names the CPU and those flags beside its figures.
#
#   Code.require_file("support/machine.exs", __DIR__)
#   Bench.Machine.line()          # "machine: AMD EPYC, 2 CPUs; ISA avx2 fma (none of ...)"
#   Bench.Machine.results_file("cpu_peer")   # bench/results/cpu_peer_amd-epyc-avx2_<date>.txt
defmodule Bench.Machine do
  # The flags that decide which kernels run (cpuinfo's names), widest last within each family.
  @isa ~w(avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 avx512_fp16 avx_vnni amx_tile amx_bf16 amx_int8)

  def cpuinfo do
    case File.read("/proc/cpuinfo") do
      {:ok, text} -> text
      {:error, _} -> ""
    end
  end

  defp field(key) do
    cpuinfo()
    |> String.split("\n")
    |> Enum.find_value("", fn line ->
      case String.split(line, ":", parts: 2) do
        [k, v] -> if String.trim(k) == key, do: String.trim(v)
        _ -> nil
      end
    end)
  end

  def cpu_model do
    case field("model name") do
      "" -> to_string(:erlang.system_info(:system_architecture))
      name -> name
    end
  end

  @doc """
  The ISA flags of `@isa` this CPU has, in `@isa`'s order, less those hidden from the run
  (scripts/without_avx512.sh hides AVX-512 and AMX and says so in EXBURN_CPUID_MASK).
  """
  def isa do
    flags = field("flags") |> String.split() |> MapSet.new()
    Enum.filter(@isa, &(&1 in flags and not hidden?(&1)))
  end

  defp hidden?(flag) do
    masked?() and String.starts_with?(flag, ["avx512", "amx"])
  end

  defp masked?, do: System.get_env("EXBURN_CPUID_MASK") == "avx512"

  def cpus, do: :erlang.system_info(:logical_processors_available)

  def line do
    have = isa()
    missing = @isa -- have
    none = if missing == [], do: "", else: " (none of #{Enum.join(missing, " ")})"
    mask = if masked?(), do: "; AVX-512 and AMX hidden by scripts/without_avx512.sh", else: ""
    "machine: #{cpu_model()}, #{cpus()} CPUs; ISA #{Enum.join(have, " ")}#{none}#{mask}"
  end

  # The widest vector tier, as a file name's last word: the tier decides what the peers run.
  defp tier(have) do
    cond do
      "amx_tile" in have -> "amx"
      "avx512f" in have -> "avx512"
      "avx2" in have -> "avx2"
      true -> "baseline"
    end
  end

  @doc "A file-name word for this machine: the CPU's name without its marks, and the ISA tier."
  def slug do
    name =
      cpu_model()
      |> String.replace(~r/\((R|TM|tm|r)\)|@.*$|\bCPU\b|\bProcessor\b|\b\d+-Core\b/, " ")
      |> String.downcase()
      |> String.replace(~r/[^a-z0-9]+/, "-")
      |> String.trim("-")

    if masked?(), do: "#{name}-avx512-as-#{tier(isa())}", else: "#{name}-#{tier(isa())}"
  end

  @doc """
  The load average, and the f32 FMA rate the CPUs deliver together at this moment
  (`fma_rate/0`): on a VM whose vCPUs share physical cores with other tenants, the second moves
  (here between one core's rate and two cores') where the first does not.
  """
  def loadavg do
    load = File.read!("/proc/loadavg") |> String.split() |> Enum.take(3) |> Enum.join(" ")

    case fma_rate() do
      nil -> load
      gflops -> "#{load}; FMA #{round(gflops)} GFLOP/s on #{cpus()} threads"
    end
  end

  @doc """
  GFLOP/s of AVX2 FMA chains on every CPU at once (support/fma_probe.c, built once per run
  with `cc`), or nil without AVX2/FMA or a C compiler.
  """
  def fma_rate do
    with probe when is_binary(probe) <- fma_probe(),
         {out, 0} <- System.cmd(probe, [Integer.to_string(cpus())]),
         {gflops, _} <- Float.parse(out) do
      gflops
    else
      _ -> nil
    end
  end

  @doc "The path of the built FMA probe (support/fma_probe.c), or nil where it cannot be built."
  def fma_probe do
    case :persistent_term.get({__MODULE__, :fma_probe}, :unset) do
      :unset ->
        probe = build_fma_probe()
        :persistent_term.put({__MODULE__, :fma_probe}, probe)
        probe

      probe ->
        probe
    end
  end

  defp build_fma_probe do
    src = Path.expand("fma_probe.c", __DIR__)
    out = Path.join(System.tmp_dir!(), "exburn_fma_probe_#{System.unique_integer([:positive])}")

    with true <- "avx2" in isa() and "fma" in isa(),
         cc when is_binary(cc) <- System.find_executable("cc"),
         {_, 0} <-
           System.cmd(cc, ["-O2", "-mavx2", "-mfma", "-pthread", src, "-o", out], stderr_to_stdout: true) do
      out
    else
      _ -> nil
    end
  end

  @doc """
  Where a benchmark writes its results: EXBURN_BENCH_OUT when set ("-" for nowhere, `nil`),
  else `bench/results/<prefix>_<machine slug>_<date>.txt`.
  """
  def results_file(prefix) do
    case System.get_env("EXBURN_BENCH_OUT") do
      "-" -> nil
      nil -> Path.expand("../results/#{prefix}_#{slug()}_#{Date.utc_today()}.txt", __DIR__)
      path -> path
    end
  end

  def write_results(nil, _lines), do: nil

  def write_results(path, lines) do
    File.mkdir_p!(Path.dirname(path))
    File.write!(path, Enum.join(lines, "\n") <> "\n")
    IO.puts("wrote #{path}")
  end
end
