defmodule ExBurn.BenchTest do
  use ExUnit.Case, async: false
  import ExUnit.CaptureIO

  alias ExBurn.Bench
  alias ExBurn.Bench.Report

  # Synthetic results with known numbers, so the report's charts can be checked exactly.
  defp synthetic do
    row = fn engine, impl, ms ->
      Bench.case_map(
        %{suite: "embed", case: "batch 32", engine: engine, device: "cpu:0", implementation: impl},
        [ms, ms, ms * 2],
        32,
        "embeddings/s"
      )
    end

    cases = [
      row.("burn", "ExBurn", 10.0),
      row.("candle", "ExBurn", 20.0),
      row.("python", "sentence-transformers <&>", 40.0)
    ]

    %{
      environment: Bench.environment(iterations: 3, devices: [{:cpu, 0}]),
      cases: cases,
      ratios: [
        %{
          suite: "embed",
          case: "batch 32",
          engine: "burn",
          device: "cpu:0",
          reference: "st",
          exburn_ms: 10.0,
          reference_ms: 40.0,
          ratio: 0.25
        }
      ],
      notes: ["llm: the model is not installed"]
    }
  end

  test "measure: samples, nearest-rank percentiles and throughput from the median" do
    c = Bench.case_map(%{case: "x"}, [4.0, 1.0, 3.0, 2.0, 100.0], 10, "items/s")
    assert {c.p50_ms, c.p90_ms, c.p99_ms} == {3.0, 100.0, 100.0}
    assert_in_delta c.throughput, 10 / 0.003, 1.0e-6
    assert Bench.percentile([5.0], 50) == 5.0

    calls = :counters.new(1, [])
    c = Bench.measure(%{case: "y"}, 4, 1, "calls/s", fn -> :counters.add(calls, 1, 1) end)
    # one warm-up call plus four timed ones
    assert :counters.get(calls, 1) == 5
    assert length(c.samples_ms) == 4 and Enum.all?(c.samples_ms, &(&1 >= 0))
  end

  test "the report is self-contained HTML with one throughput and one latency chart per case" do
    html = Report.html(synthetic())
    assert html =~ "<!DOCTYPE html>"
    refute html =~ ~r/<script|src="http|href="http/
    assert length(Regex.scan(~r/<svg /, html)) == 2
    # bar widths are proportional to throughput: burn 2x candle, 4x python
    [burn, candle, python] =
      Regex.scan(~r/<rect class="bar" x="\d+" y="\d+" width="([\d.]+)" height="22" fill="(#[0-9a-f]+)"/, html)
      |> Enum.map(fn [_, w, _] -> String.to_float(w) end)

    assert_in_delta burn / candle, 2.0, 0.01
    assert_in_delta burn / python, 4.0, 0.02
    # text is escaped, the ratio table and the environment are there
    assert html =~ "sentence-transformers &lt;&amp;&gt;"
    assert html =~ ~s(<td class="num good">0.250</td>)
    assert html =~ "load_average"
    assert html =~ "llm: the model is not installed"
  end

  test "the ops and train suites run and produce well-formed cases" do
    results = Bench.run([:ops, :train], iterations: 2)
    ops = Enum.filter(results.cases, &(&1.suite == "ops"))
    assert Enum.map(ops, & &1.case) == ExBurn.Bench.Ops.cases()
    assert [%{suite: "train", unit: "samples/s"}] = Enum.filter(results.cases, &(&1.suite == "train"))

    for c <- results.cases do
      assert length(c.samples_ms) == 2
      assert c.p50_ms <= c.p99_ms and c.throughput > 0
    end

    assert results.ratios == []
    assert results.environment.cores == System.schedulers_online()
  end

  @tag :tmp_dir
  test "mix ex_burn.bench writes report.html and results.json atomically", %{tmp_dir: dir} do
    stderr =
      capture_io(:stderr, fn ->
        capture_io(fn -> Mix.Task.rerun("ex_burn.bench", ["ops", "--iterations", "1", "--out", dir]) end)
      end)

    assert stderr =~ "[##############################] "
    assert File.ls!(dir) |> Enum.sort() == ["report.html", "results.json"]
    json = dir |> Path.join("results.json") |> File.read!() |> ExBurn.JSON.decode!()
    assert length(json["cases"]) == length(ExBurn.Bench.Ops.cases())
    assert File.read!(Path.join(dir, "report.html")) =~ "<svg"

    assert_raise Mix.Error, ~r/unknown suite "gpu"/, fn -> Mix.Task.rerun("ex_burn.bench", ["gpu"]) end

    assert_raise Mix.Error, ~r/--compare takes python/, fn ->
      Mix.Task.rerun("ex_burn.bench", ["ops", "--compare", "r"])
    end
  end

  @chromium System.find_executable("chromium") || System.find_executable("chromium-browser")
  @pil System.find_executable("python3") &&
         match?({_, 0}, System.cmd("python3", ["-c", "import PIL"], stderr_to_stdout: true))
  @tag :tmp_dir
  if !(@chromium && @pil), do: @tag(skip: "needs chromium and python3 with Pillow (.ci/run installs them)")

  test "headless Chromium renders the charts in their proportions", %{tmp_dir: dir} do
    page = Path.join(dir, "report.html")
    File.write!(page, Report.html(synthetic()))
    shot = Path.join(dir, "shot.png")

    {_, 0} =
      System.cmd(
        @chromium,
        ~w(--headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1000,900 --screenshot=#{shot} file://#{page}),
        stderr_to_stdout: true
      )

    # pixels of each implementation's exact bar color: equal heights, so areas follow widths
    count = """
    import json, sys
    from collections import Counter
    from PIL import Image
    b = Image.open(sys.argv[1]).convert("RGB").tobytes()
    px = Counter(zip(b[0::3], b[1::3], b[2::3]))
    colors = {"burn": (0xe4, 0x57, 0x2e), "candle": (0x2e, 0x86, 0xab), "python": (0x76, 0xb0, 0x41)}
    print(json.dumps({k: px[c] for k, c in colors.items()}))
    """

    {out, 0} = System.cmd("python3", ["-c", count, shot])
    %{"burn" => burn, "candle" => candle, "python" => python} = ExBurn.JSON.decode!(out)
    # the legend swatches add 144 pixels of each color
    assert burn > 5000
    assert_in_delta (burn - 144) / (candle - 144), 2.0, 0.1
    assert_in_delta (burn - 144) / (python - 144), 4.0, 0.3
  end
end
