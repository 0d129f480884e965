defmodule ExBurn.Scripts.LlvmStandinTest do
  # scripts/llvm-standin.sh --check: what it reports for a missing, a present and a ROCm-incomplete
  # stand-in, in a temporary data home and LLVM prefix (nothing outside them is read or written).
  use ExUnit.Case, async: true

  @script Path.expand("../../scripts/llvm-standin.sh", __DIR__)

  setup do
    root = Path.join(System.tmp_dir!(), "exburn-standin-#{System.unique_integer([:positive])}")
    on_exit(fn -> File.rm_rf!(root) end)
    %{data: Path.join(root, "data"), prefix: Path.join(root, "llvm")}
  end

  defp check(ctx, args) do
    env = [{"XDG_DATA_HOME", ctx.data}, {"EXBURN_LLVM_PREFIX", ctx.prefix}]
    System.cmd("bash", [@script, "--check" | args], env: env, stderr_to_stdout: true)
  end

  # what the script itself writes: the marker and an llvm-config that answers --version
  defp fake_standin(ctx) do
    bin = Path.join([ctx.data, "tracel", "tracel-llvm-23.1.0-4", "bin"])
    File.mkdir_p!(bin)
    File.write!(Path.join(bin, "../.tracel-llvm-installed"), "")
    File.write!(Path.join(bin, "llvm-config"), "#!/bin/sh\necho 22.1.8\n")
    File.chmod!(Path.join(bin, "llvm-config"), 0o755)
  end

  test "no stand-in: exit 1", ctx do
    assert {out, 1} = check(ctx, [])
    assert out =~ "stand-in missing or broken"
  end

  test "a stand-in is ready for cuda; rocm also needs LLD, and says so", ctx do
    fake_standin(ctx)
    assert {out, 0} = check(ctx, [])
    assert out =~ "stand-in ready"
    assert out =~ "LLVM 22.1.8"

    assert {out, 1} = check(ctx, ["--rocm"])
    assert out =~ "include/lld/Common/Driver.h is missing (rocm needs liblld-22-dev)"

    for f <- ["include/lld/Common/Driver.h", "lib/liblldCommon.a", "lib/liblldELF.a"] do
      path = Path.join(ctx.prefix, f)
      File.mkdir_p!(Path.dirname(path))
      File.write!(path, "")
    end

    assert {out, 0} = check(ctx, ["--rocm"])
    assert out =~ "stand-in ready"
  end
end
