defmodule ExBurn.Scripts.FmaProbeTest do
  # bench/support/machine.exs's load line: the load average, then the CPUs' FMA rate measured by
  # bench/support/fma_probe.c where the CPU has AVX2 and FMA and a C compiler is present.
  use ExUnit.Case, async: false

  Code.require_file("../../bench/support/machine.exs", __DIR__)

  test "the load line names the three load averages and, where it can be measured, the FMA rate" do
    line = Bench.Machine.loadavg()
    assert [_, _, _] = line |> String.split(";") |> hd() |> String.split() |> Enum.map(&String.to_float/1)

    if "avx2" in Bench.Machine.isa() and "fma" in Bench.Machine.isa() and System.find_executable("cc") do
      threads = Bench.Machine.cpus()
      assert [_, gflops] = Regex.run(~r/; FMA (\d+) GFLOP\/s on #{threads} threads$/, line)
      # at least 8 lanes x 2 flops at 100 MHz per thread together: the probe ran and was timed
      assert String.to_integer(gflops) >= 1.6 * threads
    else
      refute line =~ "FMA"
    end
  end
end
