defmodule ExBurn.Scripts.NcuSummaryTest do
  # bench/ncu_summary.py on a small report in Nsight Compute's CSV layout (its log lines first,
  # thousands separators in values, a second metric to ignore); the expected figures are worked
  # out by hand from the durations below.
  use ExUnit.Case, async: true

  @script Path.expand("../../bench/ncu_summary.py", __DIR__)
  @header ~s("ID","Process ID","Kernel Name","Metric Name","Metric Unit","Metric Value")

  defp row(id, kernel, ns, metric \\ "gpu__time_duration.sum"),
    do: ~s("#{id}","1","#{kernel}","#{metric}","ns","#{ns}")

  test "launch counts, and the median and minimum of the later half of each kernel's launches" do
    path = Path.join(System.tmp_dir!(), "ncu-#{System.unique_integer([:positive])}.csv")
    on_exit(fn -> File.rm(path) end)

    # gemm: 1000, 5000 | 3000, 2000 -> later half sorted [2000, 3000]: median 3.0 µs, min 2.0
    # add: 9000, 1, 1 | 10,000 12,000 11,000 10,500 -> [10000, 10500, 11000, 12000]: 11.0, 10.0
    lines = [
      "==PROF== Connected to process 1",
      @header,
      row(0, "gemm", "1,000"),
      row(1, "add", "9,000"),
      row(2, "gemm", "5,000"),
      row(3, "add", "1"),
      row(4, "add", "1"),
      row(5, "gemm", "3,000"),
      row(6, "add", "10,000"),
      row(7, "add", "12,000"),
      row(8, "gemm", "2,000"),
      row(9, "add", "11,000"),
      row(10, "add", "10,500"),
      row(11, "add", "999,999", "dram__bytes.sum"),
      "==PROF== Disconnected from process 1"
    ]

    File.write!(path, Enum.join(lines, "\n") <> "\n")
    assert {out, 0} = System.cmd("python3", [@script, path], stderr_to_stdout: true)

    assert out =~ ~r/launches=\s+4 median_us=\s+3\.0 min_us=\s+2\.0\s+gemm/
    assert out =~ ~r/launches=\s+7 median_us=\s+11\.0 min_us=\s+10\.0\s+add/
    assert length(Regex.scan(~r/launches=/, out)) == 2
  end
end
