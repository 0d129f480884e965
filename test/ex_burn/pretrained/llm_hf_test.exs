defmodule ExBurn.Pretrained.LLMHfTest do
  # Hugging Face LLM directories (config.json, safetensors, tokenizer.json) through the Elixir
  # API, on the tiny models test/data/gen_hf_llm_dirs.py writes (committed): the Qwen2 and Phi-3
  # models of the GGUF tests, saved as f16 safetensors and held to the same transformers
  # references, and a Llama with Llama 3 rope scaling in bf16 shards. The Rust tests
  # (hf_llm_tests.rs) hold logits to the references and check errors piece by piece.
  use ExUnit.Case, async: true

  alias ExBurn.LLM

  @data Path.expand("../../data/llm", __DIR__)
  @qwen @data |> Path.join("reference.json") |> File.read!() |> ExBurn.JSON.decode!()
  @hf @data |> Path.join("hf/reference.json") |> File.read!() |> ExBurn.JSON.decode!()
  @spm @data |> Path.join("reference_spm.json") |> File.read!() |> ExBurn.JSON.decode!()

  defp prompt(%{"kind" => "chat", "messages" => ms}),
    do: Enum.map(ms, &%{role: &1["role"], content: &1["content"]})

  defp prompt(%{"prompt" => p}), do: p

  defp reference("tiny-qwen2"), do: {"qwen2", 384, @qwen["qwen2"]["eos_token_id"], @qwen["qwen2"]["generate"]}

  defp reference("tiny-llama3"),
    do: {"llama", 384, @hf["tiny-llama3"]["eos_token_id"], @hf["tiny-llama3"]["generate"]}

  defp reference("tiny-phi3"), do: {"phi3", 400, 2, @spm["models"]["phi3"]["generate"]}

  for name <- ["tiny-qwen2", "tiny-llama3", "tiny-phi3"], engine <- [:burn, :candle] do
    test "#{name} on #{engine}: loads from its directory and generates as transformers" do
      {arch, vocab, eos, cases} = reference(unquote(name))
      model = LLM.load!(Path.join([@data, "hf", unquote(name)]), engine: unquote(engine), device: :cpu)
      assert %LLM{arch: ^arch, engine: unquote(engine), vocab_size: ^vocab, context_length: 128} = model
      assert eos in model.eos_token_ids

      for g <- Enum.filter(cases, &(&1["kind"] in [nil, "raw", "chat"])) do
        # generation stops at end of sequence, where the SentencePiece references went on
        want = Enum.take_while(g["generated_ids"], &(&1 != eos))
        {:ok, r} = LLM.generate(model, prompt(g), max_tokens: length(g["generated_ids"]), greedy: true)
        assert r.prompt_ids == g["prompt_ids"], "prompt ids of #{inspect(g["prompt"])}"
        # the directories hold the reference models' own weights
        assert r.generated_ids == want, "#{unquote(name)} #{unquote(engine)}: #{inspect(g["prompt"])}"
      end
    end
  end

  test "the models directory lists a Hugging Face LLM directory, and it loads by name" do
    dir = Path.join(System.tmp_dir!(), "exburn-hf-#{System.unique_integer([:positive])}")
    File.mkdir_p!(Path.join(dir, "llm"))
    File.cp_r!(Path.join([@data, "hf", "tiny-llama3"]), Path.join([dir, "llm", "tiny-llama3"]))
    on_exit(fn -> File.rm_rf!(dir) end)

    assert [%{name: "tiny-llama3", kind: :llm, format: :safetensors, arch: "llama"}] =
             ExBurn.Models.list(dir: dir)

    assert {:ok, %LLM{arch: "llama", vocab_size: 384}} = LLM.load("tiny-llama3", dir: dir, device: :cpu)
  end

  test "a directory of an unsupported model_type is a typed error" do
    dir = Path.join(System.tmp_dir!(), "exburn-hf-#{System.unique_integer([:positive])}")
    File.cp_r!(Path.join([@data, "hf", "tiny-qwen2"]), dir)
    on_exit(fn -> File.rm_rf!(dir) end)
    config = dir |> Path.join("config.json") |> File.read!() |> ExBurn.JSON.decode!()
    File.write!(Path.join(dir, "config.json"), ExBurn.JSON.encode!(Map.put(config, "model_type", "gemma7")))

    assert {:error, %ExBurn.Error{details: %{kind: :unknown_architecture, arch: "gemma7"}}} =
             LLM.load(dir, device: :cpu)
  end
end
