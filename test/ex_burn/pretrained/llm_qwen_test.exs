defmodule ExBurn.Pretrained.LLMQwenTest do
  # Qwen2 and Qwen3 GGUF files through the Elixir API, on the tiny random models
  # test/data/gen_llm_refs.py writes (committed, so nothing skips), against its transformers
  # references. The Rust tests (llm_family_tests.rs) hold logits to them; this checks the path
  # from ExBurn.LLM: loading, the chat template, tokenising and greedy generation.
  use ExUnit.Case, async: true

  import ExBurn.PretrainedCase, only: [assert_follows_reference: 4]
  alias ExBurn.LLM

  @data Path.expand("../../data/llm", __DIR__)
  @ref @data |> Path.join("reference.json") |> File.read!() |> ExBurn.JSON.decode!()

  defp prompt(%{"kind" => "chat", "messages" => ms}),
    do: Enum.map(ms, &%{role: &1["role"], content: &1["content"]})

  defp prompt(%{"prompt" => p}), do: p

  for arch <- ["qwen2", "qwen3"], {label, engine} <- [{"F16", :burn}, {"F16", :candle}, {"Q8_0", :auto}] do
    test "#{arch} #{label} on #{engine}: metadata, prompts and greedy ids as transformers'" do
      ref = @ref[unquote(arch)]
      path = Path.join(@data, ref["files"][unquote(label)])
      model = LLM.load!(path, engine: unquote(engine), device: :cpu)
      # :auto runs it on burn
      assert %LLM{arch: unquote(arch), engine: engine, vocab_size: 384, context_length: 128} = model
      assert engine in [:burn, :candle] and (unquote(engine) == :auto or engine == unquote(engine))
      assert model.chat_template == ref["chat_template"]
      assert ref["eos_token_id"] in model.eos_token_ids

      for c <- ref["tokenize"] do
        assert {:ok, c["ids"]} == LLM.tokenize(model, c["text"]), inspect(c["text"])
      end

      cases = ref["generate_#{unquote(label)}"] || ref["generate"]

      for g <- Enum.filter(cases, &(&1["kind"] in ["raw", "chat"])) do
        {:ok, r} = LLM.generate(model, prompt(g), max_tokens: length(g["generated_ids"]), greedy: true)
        assert r.prompt_ids == g["prompt_ids"], "prompt ids of #{inspect(g["prompt"])}"
        equal = assert_follows_reference(r.generated_ids, g["generated_ids"], g, "#{unquote(engine)}")
        # the F16 file holds transformers' own weights: its greedy ids are transformers'
        if unquote(label) == "F16", do: assert(equal)
      end
    end
  end
end
