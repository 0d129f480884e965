defmodule Mix.Tasks.Compile.ExBurnNative do
  @moduledoc """
  Builds the `ex_burn` Rust crate with cargo (release profile) and installs the NIF library as
  `priv/native/libex_burn.so`.

  * Cargo features come from the comma-separated `EXBURN_FEATURES` environment variable and from
    `config :ex_burn, features: [...]`.
  * cargo's target directory is `CARGO_TARGET_DIR` when set, else `target/` in the project root.
  * cargo is not run when the installed library is newer than every crate source and manifest and
    was built with the same feature set (recorded in `priv/native/ex_burn.features`).
  * `EXBURN_SKIP_NATIVE=1` skips this compiler entirely (documentation builds).
  """
  use Mix.Task.Compiler

  @root Path.expand("../..", __DIR__)
  @crate "ex_burn"

  @impl true
  def run(_args) do
    cond do
      System.get_env("EXBURN_SKIP_NATIVE") not in [nil, "", "0", "false"] ->
        {:noop, []}

      up_to_date?(features()) ->
        {:noop, []}

      true ->
        build(features())
    end
  end

  @impl true
  def manifests, do: [features_file()]

  @impl true
  def clean do
    File.rm(installed_lib())
    File.rm(features_file())
    :ok
  end

  @doc "cargo's target directory: `CARGO_TARGET_DIR` if set, else `target/` in the project root."
  def target_dir do
    case System.get_env("CARGO_TARGET_DIR") do
      dir when dir in [nil, ""] -> Path.join(@root, "target")
      dir -> Path.expand(dir, @root)
    end
  end

  @doc "The sorted, de-duplicated cargo feature list from `EXBURN_FEATURES` and app config."
  def features do
    from_env = String.split(System.get_env("EXBURN_FEATURES") || "", ",")
    from_config = Enum.map(List.wrap(Application.get_env(:ex_burn, :features, [])), &to_string/1)

    (from_env ++ from_config)
    |> Enum.map(&String.trim/1)
    |> Enum.reject(&(&1 == ""))
    |> Enum.uniq()
    |> Enum.sort()
  end

  defp native_dir, do: Path.join(@root, "priv/native")
  defp installed_lib, do: Path.join(native_dir(), "lib#{@crate}.so")
  defp features_file, do: Path.join(native_dir(), "#{@crate}.features")

  defp sources do
    Path.wildcard(Path.join(@root, "native/#{@crate}/src/**/*")) ++
      Enum.map(["native/#{@crate}/Cargo.toml", "Cargo.toml", "Cargo.lock"], &Path.join(@root, &1))
  end

  defp up_to_date?(features) do
    with {:ok, %File.Stat{mtime: installed}} <- File.stat(installed_lib(), time: :posix),
         {:ok, recorded} <- File.read(features_file()),
         true <- recorded == Enum.join(features, ",") do
      Enum.all?(sources(), fn source ->
        case File.stat(source, time: :posix) do
          {:ok, %File.Stat{type: :directory}} -> true
          {:ok, %File.Stat{mtime: mtime}} -> installed > mtime
          {:error, _} -> true
        end
      end)
    else
      _ -> false
    end
  end

  defp build(features) do
    case System.find_executable("cargo") do
      nil ->
        error(
          "cargo not found in PATH: ExBurn needs Rust >= 1.85 (https://rustup.rs) to build its NIF " <>
            "(set EXBURN_SKIP_NATIVE=1 to skip the native build, e.g. for docs)"
        )

      cargo ->
        args =
          ["build", "--release", "-p", @crate] ++
            if(features == [], do: [], else: ["--features", Enum.join(features, ",")])

        Mix.shell().info("==> cargo #{Enum.join(args, " ")}")

        {_, status} =
          System.cmd(cargo, args,
            cd: @root,
            env: [{"CARGO_TARGET_DIR", target_dir()}],
            into: IO.stream(:stdio, :line),
            stderr_to_stdout: true
          )

        if status == 0,
          do: install(features),
          else: error("cargo build failed (exit #{status}); see output above")
    end
  end

  # BEAM loads NIFs by the `.so` name on every Unix, so macOS' .dylib is installed renamed.
  defp install(features) do
    release = Path.join(target_dir(), "release")

    built =
      Enum.find(
        [Path.join(release, "lib#{@crate}.so"), Path.join(release, "lib#{@crate}.dylib")],
        &File.regular?/1
      )

    if built do
      File.mkdir_p!(native_dir())
      atomic_copy!(built, installed_lib())
      atomic_write!(features_file(), Enum.join(features, ","))
      # The app's priv/ symlink in _build is only made when priv/ exists, which on a fresh clone
      # happens just now.
      Mix.Project.build_structure()
      {:ok, []}
    else
      error("cargo build succeeded but no lib#{@crate}.so/.dylib was found in #{release}")
    end
  end

  # Copy next to the destination, then rename: a VM loading the library never sees a half-written file.
  defp atomic_copy!(from, to) do
    tmp = to <> ".tmp#{System.unique_integer([:positive])}"
    File.cp!(from, tmp)
    File.rename!(tmp, to)
  end

  defp atomic_write!(path, contents) do
    tmp = path <> ".tmp#{System.unique_integer([:positive])}"
    File.write!(tmp, contents)
    File.rename!(tmp, path)
  end

  defp error(message) do
    Mix.shell().error(message)

    {:error,
     [
       %Mix.Task.Compiler.Diagnostic{
         compiler_name: "ex_burn_native",
         file: Path.join(@root, "native/#{@crate}/Cargo.toml"),
         position: nil,
         message: message,
         severity: :error,
         details: nil
       }
     ]}
  end
end
