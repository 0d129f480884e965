defmodule ExBurn.Pretrained.MixTasksTest do
  # The pre-trained models' mix tasks, run as a user runs them, their JSON checked against the
  # independent references in test/data/pretrained.
  use ExUnit.Case, async: false
  import ExUnit.CaptureIO
  import ExBurn.PretrainedCase

  @embedder "all-minilm-l6-v2"
  @llm "smollm2-135m-instruct"

  defp run_task(task, args) do
    capture_io(fn -> Mix.Task.rerun(task, args) end)
  end

  test "mix ex_burn.models --json lists what ExBurn.Models.list finds" do
    listed = run_task("ex_burn.models", ["--json"]) |> ExBurn.JSON.decode!()
    expected = ExBurn.Models.list()
    assert Enum.map(listed, & &1["name"]) == Enum.map(expected, & &1.name)
    assert Enum.map(listed, & &1["kind"]) == Enum.map(expected, &Atom.to_string(&1.kind))
  end

  @tag :tmp_dir
  test "mix ex_burn.models on an empty directory says so", %{tmp_dir: dir} do
    assert run_task("ex_burn.models", ["--dir", dir]) =~ "no models"
    assert run_task("ex_burn.models", ["--dir", dir, "--json"]) == "[]\n"
  end

  if reason = skip_unless_installed(:embedding, @embedder), do: @tag(skip: reason)
  @tag :tmp_dir
  test "mix ex_burn.embed --json: one row per line, equal to sentence-transformers", %{tmp_dir: dir} do
    cases = reference("minilm_reference.json")["cases"] |> Enum.take(7)
    texts = Enum.map(cases, & &1["text"])
    file = Path.join(dir, "in.txt")
    File.write!(file, Enum.join(texts, "\n") <> "\n")

    for args <- [["--file", file], ["--file", file, "--engine", "candle"]] do
      out = run_task("ex_burn.embed", ["--model", @embedder, "--json" | args]) |> ExBurn.JSON.decode!()
      assert %{"model" => @embedder, "dim" => 384, "token_ids" => ids, "embeddings" => rows} = out
      assert ids == Enum.map(cases, & &1["token_ids"])

      for {row, c} <- Enum.zip(rows, cases), do: assert(cosine(row, c["embedding"]) >= 0.9999)
    end

    path = installed(:embedding, @embedder).path
    out = run_task("ex_burn.embed", ["--model", path, "--text", "x", "--json"]) |> ExBurn.JSON.decode!()
    assert out["token_ids"] == [[101, 1060, 102]]
  end

  if reason = skip_unless_installed(:llm, @llm), do: @tag(skip: reason)

  test "mix ex_burn.llm --json follows transformers' greedy generation" do
    g =
      reference("smollm2_reference.json")["generate"]
      |> Enum.find(&(&1["prompt"] == "The capital of France is"))

    greedy_16 = ["--model", @llm, "--prompt", g["prompt"], "--greedy", "--max-tokens", "16"]
    out = run_task("ex_burn.llm", greedy_16 ++ ["--json"]) |> ExBurn.JSON.decode!()

    assert %{"prompt_ids" => prompt_ids, "generated_ids" => ids, "text" => text, "finish_reason" => "length"} =
             out

    assert prompt_ids == g["prompt_ids"]
    assert length(ids) == 16
    if assert_follows_reference(ids, g["generated_ids"], g, "mix ex_burn.llm"), do: assert(text == g["text"])

    streamed = run_task("ex_burn.llm", greedy_16 ++ ["--stream"])

    assert streamed == text <> "\n"

    chat =
      run_task(
        "ex_burn.llm",
        ~w(--model #{@llm} --chat --prompt Hi --greedy --max-tokens 4 --engine candle --json)
      )

    assert %{"prompt_ids" => [1 | _], "generated_ids" => [_ | _]} = ExBurn.JSON.decode!(chat)
  end

  test "usage errors raise Mix.Error with the usage" do
    assert_raise Mix.Error, ~r/--model NAME\|PATH is required/, fn ->
      run_task("ex_burn.embed", ["--text", "x"])
    end

    assert_raise Mix.Error, ~r/--text TEXT or --file FILE/, fn ->
      run_task("ex_burn.embed", ["--model", "m"])
    end

    assert_raise Mix.Error, ~r/unexpected/, fn ->
      run_task("ex_burn.llm", ["--model", "m", "--promt", "x"])
    end

    assert_raise Mix.Error, ~r/--engine must be/, fn ->
      run_task("ex_burn.llm", ~w(--model m --prompt x --engine gpu))
    end

    assert_raise Mix.Error, ~r/no llm model named "nope"/, fn ->
      run_task("ex_burn.llm", ~w(--model nope --prompt x))
    end
  end
end
