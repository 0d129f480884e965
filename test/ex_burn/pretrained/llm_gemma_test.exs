defmodule ExBurn.Pretrained.LLMGemmaTest do
  # Gemma, Gemma 2 and Gemma 3 through the Elixir API, on the tiny models test/data/gen_gemma_refs.py
  # writes (committed): the Hugging Face directory of each, on both engines, against
  # transformers' prompt ids and greedy tokens. The Rust tests (gemma_tests.rs) hold logits to
  # the references, on the GGUF files too.
  use ExUnit.Case, async: true

  alias ExBurn.LLM

  @data Path.expand("../../data/llm/gemma", __DIR__)
  @ref @data |> Path.join("reference.json") |> File.read!() |> ExBurn.JSON.decode!()

  for arch <- ["gemma", "gemma2", "gemma3"], engine <- [:burn, :candle] do
    test "#{arch} directory on #{engine}: prompt ids and greedy tokens as transformers'" do
      ref = @ref[unquote(arch)]
      model = LLM.load!(Path.join(@data, ref["dir"]), engine: unquote(engine), device: :cpu)
      assert %LLM{arch: unquote(arch), engine: unquote(engine), vocab_size: 400, context_length: 128} = model

      for g <- Enum.filter(ref["generate"], &(&1["kind"] == "raw")) do
        # generation stops at end of sequence (id 2)
        want = Enum.take_while(g["generated_ids"], &(&1 != 2))
        {:ok, r} = LLM.generate(model, g["prompt"], max_tokens: length(g["generated_ids"]), greedy: true)
        assert r.prompt_ids == g["prompt_ids"]
        assert r.generated_ids == want, inspect(g["prompt"])
      end
    end
  end
end
