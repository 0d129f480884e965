defmodule ExBurn.Scripts.NxStackTest do
  # scripts/nx-stack.sh on stand-in tarballs in a temporary folder: checksums are checked, each
  # tarball is unpacked and Elixir built once, and --env names the unpacked projects.
  use ExUnit.Case, async: true

  @script Path.expand("../../scripts/nx-stack.sh", __DIR__)
  @stems ~w(elixir-1.18.4 nx-0.13.1 complex-0.6.0 telemetry-1.2.1 axon-0.8.1 polaris-0.1.0)

  setup do
    root = Path.join(System.tmp_dir!(), "exburn-nx-stack-#{System.unique_integer([:positive])}")
    on_exit(fn -> File.rm_rf!(root) end)
    %{deps: Path.join(root, "deps"), cache: Path.join(root, "cache"), src: Path.join(root, "src")}
  end

  defp run(ctx, args) do
    env = [{"EXBURN_DEPS_DIR", ctx.deps}, {"EXBURN_NX_STACK_DIR", ctx.cache}]
    System.cmd("bash", [@script | args], env: env, stderr_to_stdout: true)
  end

  # Tarballs shaped like the real ones: nx's Mix project in nx/, and an Elixir whose
  # `make compile` writes bin/elixir and counts its runs.
  defp fake_tarballs(ctx) do
    File.mkdir_p!(ctx.deps)

    for stem <- @stems do
      dir = Path.join(ctx.src, stem)
      File.mkdir_p!(Path.join(dir, "nx"))
      File.write!(Path.join(dir, "mix.exs"), "")

      if stem =~ "elixir" do
        File.write!(
          Path.join(dir, "Makefile"),
          "compile:\n\tmkdir -p bin && printf '#!/bin/sh\\n' > bin/elixir && chmod +x bin/elixir\n" <>
            "\techo built >> ../builds\n"
        )
      end

      {_, 0} = System.cmd("tar", ["czf", Path.join(ctx.deps, "#{stem}.tar.gz"), "-C", ctx.src, stem])
    end

    {sums, 0} = System.cmd("sha256sum", Enum.map(@stems, &"#{&1}.tar.gz"), cd: ctx.deps)
    File.write!(Path.join(ctx.deps, "SHA256SUMS"), sums)
  end

  test "without tarballs it exits 3 and says where it looked", ctx do
    assert {out, 3} = run(ctx, [])
    assert out =~ "no pinned tarballs in #{ctx.deps}"
    assert {out, 1} = run(ctx, ["--check"])
    assert out =~ "not prepared"
  end

  test "a tarball that differs from its checksum stops it", ctx do
    fake_tarballs(ctx)
    File.write!(Path.join(ctx.deps, "axon-0.8.1.tar.gz"), "not the release")
    assert {out, 1} = run(ctx, [])
    assert out =~ "checksums differ"
    refute File.exists?(Path.join(ctx.cache, "elixir-1.18.4/bin/elixir"))
  end

  test "prepares once, then prints the path deps and Elixir of the cache", ctx do
    fake_tarballs(ctx)
    assert {_, 0} = run(ctx, [])
    assert {out, 0} = run(ctx, ["--check"])
    assert out =~ "ready"
    assert {env, 0} = run(ctx, ["--env"])
    assert File.read!(Path.join(ctx.cache, "builds")) == "built\n"

    assert env =~ ~s(export PATH="#{ctx.cache}/elixir-1.18.4/bin:$PATH")
    assert env =~ ~s(export EXBURN_NX_PATH="#{ctx.cache}/nx-0.13.1/nx")
    assert env =~ ~s(export EXBURN_AXON_PATH="#{ctx.cache}/axon-0.8.1")
    assert env =~ "export EXBURN_NO_HEX=1"
    [_, local] = Regex.run(~r/EXBURN_LOCAL_DEPS="([^"]+)"/, env)

    assert local |> String.split(",") |> Enum.sort() ==
             Enum.sort([
               "nx=#{ctx.cache}/nx-0.13.1/nx",
               "complex=#{ctx.cache}/complex-0.6.0",
               "telemetry=#{ctx.cache}/telemetry-1.2.1",
               "axon=#{ctx.cache}/axon-0.8.1",
               "polaris=#{ctx.cache}/polaris-0.1.0"
             ])
  end
end
