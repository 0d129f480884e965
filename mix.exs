# The project's own Mix tasks live outside lib/ so they are not compiled into the application.
for {module, file} <- [
      {Mix.Tasks.Compile.ExBurnNative, "tasks/compile.ex_burn_native.ex"},
      {Mix.Tasks.Test.All, "tasks/test.all.ex"},
      {ExBurn.MixProject.OverriddenSCM, "overridden_scm.ex"}
    ],
    not Code.ensure_loaded?(module),
    do: Code.require_file(Path.join("mix", file), __DIR__)

defmodule ExBurn.MixProject do
  use Mix.Project
  alias ExBurn.MixProject.OverriddenSCM

  @version "0.1.0"

  def project do
    [
      app: :ex_burn,
      version: @version,
      elixir: "~> 1.14",
      start_permanent: Mix.env() == :prod,
      # Nx's own test suite (test/nx_suite/run.exs) defines protocol implementations at run time
      consolidate_protocols: System.get_env("EXBURN_NX_SUITE") != "1",
      compilers: [:ex_burn_native] ++ Mix.compilers(),
      deps: deps(),
      aliases: aliases(),
      description: "Burn (Rust deep learning) for Elixir: tensors, an Nx backend and native training",
      docs: [main: "readme", extras: ["README.md"]]
    ] ++ legacy_cli_env()
  end

  # Elixir >= 1.15 reads preferred environments from cli/0; 1.14 only knows :preferred_cli_env
  # (which later versions deprecate), so it is added only there.
  def cli, do: [preferred_envs: ["test.all": :test]]

  defp legacy_cli_env do
    if Version.match?(System.version(), "< 1.15.0"),
      do: [preferred_cli_env: ["test.all": :test]],
      else: []
  end

  def application do
    [extra_applications: [:logger, :inets]]
  end

  # Nx and Axon are optional. They come from Hex only when Hex is installed and EXBURN_NO_HEX is
  # unset; EXBURN_NX_PATH / EXBURN_AXON_PATH point at local checkouts instead. Without either,
  # there are no dependencies at all and the core still compiles and tests.
  #
  # EXBURN_LOCAL_DEPS="nx=/path,complex=/path,telemetry=/path" adds (or replaces) path deps,
  # overriding whatever those packages' own mix.exs require: that is how an offline machine with
  # local checkouts satisfies Nx's transitive requirements (scripts/nx-stack.sh prints such a
  # list). Without Hex, OverriddenSCM lets Mix parse the requirements these paths replace.
  defp deps do
    hex? = Code.ensure_loaded?(Hex) and System.get_env("EXBURN_NO_HEX") in [nil, ""]
    local = local_deps()

    optional =
      [nx: {"~> 0.13", "EXBURN_NX_PATH"}, axon: {"~> 0.7", "EXBURN_AXON_PATH"}]
      |> Enum.reject(fn {name, _} -> Map.has_key?(local, name) end)
      |> Enum.flat_map(fn {name, {requirement, path_env}} ->
        case System.get_env(path_env) do
          path when path not in [nil, ""] -> [{name, path: path, override: true, optional: true}]
          _ when hex? -> [{name, requirement, optional: true}]
          _ -> []
        end
      end)

    deps =
      optional ++ Enum.map(local, fn {name, path} -> {name, path: path, override: true, optional: true} end)

    if deps != [] and not hex?, do: OverriddenSCM.register()
    deps
  end

  defp local_deps do
    (System.get_env("EXBURN_LOCAL_DEPS") || "")
    |> String.split(",", trim: true)
    |> Map.new(fn entry ->
      case String.split(entry, "=", parts: 2) do
        [name, path] when name != "" and path != "" -> {String.to_atom(String.trim(name)), String.trim(path)}
        _ -> Mix.raise("EXBURN_LOCAL_DEPS entries must be name=path, got: #{inspect(entry)}")
      end
    end)
  end

  defp aliases do
    [quickstart: ["run examples/quickstart.exs"]]
  end
end
