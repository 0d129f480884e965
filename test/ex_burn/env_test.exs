defmodule ExBurn.EnvTest do
  # Sets environment variables and application config the whole VM reads.
  use ExUnit.Case, async: false

  alias ExBurn.Env

  @root Path.expand("../..", __DIR__)
  @guide "guides/configuration.md"
  @switchboards ["lib/ex_burn/env.ex", "native/ex_burn/src/process/env.rs"]

  # Where the project's variables are read, set or documented. bench/results holds records of
  # past runs, which keep the names they were run with.
  @scanned_dirs ~w(lib native/ex_burn/src native/ex_burn/examples mix scripts .ci bench test examples config guides)
  @scanned_files ~w(mix.exs README.md native/ex_burn/Cargo.toml)

  describe "the table in guides/configuration.md" do
    test "lists exactly the variables the source tree names" do
      in_tree = names_by_file() |> Map.values() |> Enum.reduce(MapSet.new(), &MapSet.union/2)
      in_guide = MapSet.new(Map.keys(guide_rows()))

      assert MapSet.difference(in_tree, in_guide) == MapSet.new(), "named in the tree, missing from #{@guide}"
      assert MapSet.difference(in_guide, in_tree) == MapSet.new(), "in #{@guide}, named nowhere else"
    end

    test "says which variables each switchboard reads, as their tables do" do
      rows = guide_rows()
      read_by = fn who -> for {name, reader} <- rows, reader =~ who, into: MapSet.new(), do: name end

      elixir = for {_setting, {var, _default}} <- Env.settings(), into: MapSet.new(), do: var
      assert read_by.("`ExBurn.Env`") == elixir

      rust_table = File.read!(Path.join(@root, "native/ex_burn/src/process/env.rs"))

      rust =
        for [_, name] <- Regex.scan(~r/name: "(EXBURN_[A-Z0-9_]+)"/, rust_table), into: MapSet.new(), do: name

      assert MapSet.size(rust) == 18
      assert read_by.("`process::env`") == rust
    end
  end

  test "in lib/ and the crate's src/, only the two switchboards name a variable outside comments and docs" do
    offenders =
      for {file, _names} <- names_by_file(),
          String.starts_with?(file, ["lib/", "native/ex_burn/src/"]),
          file not in @switchboards,
          names = code_names(file),
          names != [],
          do: {file, names}

    assert offenders == []
    # the check sees names where they are read
    assert code_names("lib/ex_burn/env.ex") != []
    assert "EXBURN_CUBLAS_HOST_SYNC" in code_names("native/ex_burn/src/process/env.rs")
  end

  describe "precedence: explicit > environment > application config > default" do
    setup do
      saved =
        for {setting, {var, _}} <- Env.settings(),
            do: {setting, var, System.get_env(var), Application.fetch_env(:ex_burn, setting)}

      on_exit(fn ->
        for {setting, var, env, config} <- saved do
          if env, do: System.put_env(var, env), else: System.delete_env(var)

          case config do
            {:ok, value} -> Application.put_env(:ex_burn, setting, value)
            :error -> Application.delete_env(:ex_burn, setting)
          end
        end

        ExBurn.Device.reset_default()
      end)

      for {setting, {var, _}} <- Env.settings() do
        System.delete_env(var)
        Application.delete_env(:ex_burn, setting)
      end

      :ok
    end

    test "the same order for every setting; an empty variable counts as unset" do
      for {setting, {var, default}} <- Env.settings() do
        assert Env.get(setting) == default
        assert Env.env(setting) == nil

        Application.put_env(:ex_burn, setting, "from-config")
        assert Env.get(setting) == "from-config"

        System.put_env(var, "")
        assert Env.env(setting) == nil
        assert Env.get(setting) == "from-config"

        System.put_env(var, "from-env")
        assert Env.env(setting) == "from-env"
        assert Env.get(setting) == "from-env"
        assert Env.get(setting, "explicit") == "explicit"
        # nil is "not given"
        assert Env.get(setting, nil) == "from-env"
      end

      error = assert_raise ExBurn.Error, fn -> Env.get(:no_such_setting) end
      assert {error.op, error.details.setting} == {:env, :no_such_setting}
    end

    test "the default device: configure! > EXBURN_DEVICE > config > :auto" do
      ExBurn.Device.reset_default()
      Application.put_env(:ex_burn, :device, "bogus")
      assert_raise ExBurn.Error, fn -> ExBurn.default_device() end

      # the environment wins over config
      System.put_env("EXBURN_DEVICE", "cpu:0")
      assert ExBurn.default_device() == {:cpu, 0}

      ExBurn.Device.reset_default()
      Application.put_env(:ex_burn, :device, :cpu)
      System.put_env("EXBURN_DEVICE", "bogus")
      error = assert_raise ExBurn.Error, fn -> ExBurn.default_device() end
      assert error.details == %{device: "bogus"}

      assert ExBurn.configure!(device: :cpu) == {:cpu, 0}
      assert ExBurn.default_device() == {:cpu, 0}
    end

    test "the models directory: option > EXBURN_MODELS_DIR > config > ~/models" do
      assert ExBurn.Models.dir() == Path.expand("~/models")
      Application.put_env(:ex_burn, :models_dir, "/config/models")
      assert ExBurn.Models.dir() == "/config/models"
      System.put_env("EXBURN_MODELS_DIR", "/env/models")
      assert ExBurn.Models.dir() == "/env/models"
      assert ExBurn.Models.dir(dir: "/given") == "/given"
      assert ExBurn.Models.dir(dir: nil) == "/env/models"
    end

    test "the server's token: option (nil or \"\" is none) > EXBURN_API_TOKEN > config > none" do
      token = fn opts -> ExBurn.Server.config!([models_dir: "/m"] ++ opts).token end
      assert token.([]) == nil
      Application.put_env(:ex_burn, :api_token, "from-config")
      assert token.([]) == "from-config"
      System.put_env("EXBURN_API_TOKEN", "")
      assert token.([]) == "from-config"
      System.put_env("EXBURN_API_TOKEN", "from-env")
      assert token.([]) == "from-env"
      assert token.(token: "given") == "given"
      assert token.(token: nil) == nil
      assert token.(token: "") == nil
    end
  end

  # %{relative path => names it mentions} over the scanned files
  defp names_by_file do
    files =
      Enum.flat_map(@scanned_dirs, &Path.wildcard(Path.join([@root, &1, "**", "*"]), match_dot: true)) ++
        Enum.map(@scanned_files, &Path.join(@root, &1))

    for path <- files,
        File.regular?(path),
        file = Path.relative_to(path, @root),
        not String.starts_with?(file, "bench/results/"),
        file != @guide,
        names = names(File.read!(path)),
        names != [],
        into: %{},
        do: {file, MapSet.new(names)}
  end

  defp names(text), do: ~r/EXBURN_[A-Z0-9_]+/ |> Regex.scan(text) |> List.flatten() |> Enum.uniq()

  # %{variable => its "Read by" cell}
  defp guide_rows do
    for line <- @root |> Path.join(@guide) |> File.read!() |> String.split("\n"),
        [_, name] <- [Regex.run(~r/^\| `(EXBURN_[A-Z0-9_]+)` \|/, line)],
        into: %{},
        do: {name, line |> String.split("|") |> Enum.at(-2)}
  end

  # The names in a file's code: comments and documentation taken out.
  defp code_names(file) do
    text = File.read!(Path.join(@root, file))

    code =
      if String.ends_with?(file, ".rs") do
        Regex.replace(~r{//.*}, text, "")
      else
        text
        |> then(&Regex.replace(~r/@(moduledoc|doc|typedoc)\s+(~[sS])?"""(.|\n)*?"""/, &1, ""))
        |> then(&Regex.replace(~r/@(moduledoc|doc|typedoc)\s+(~[sS])?("(\\.|[^"\\])*"|\|[^|]*\|)/, &1, ""))
        |> then(&Regex.replace(~r/(^|\s)#(?!\{).*/m, &1, ""))
      end

    names(code)
  end
end
