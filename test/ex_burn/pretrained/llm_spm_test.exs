defmodule ExBurn.Pretrained.LLMSpmTest do
  # GGUFs with a SentencePiece vocabulary (tokenizer.ggml.model "llama", as Llama 2, Mistral and
  # Phi-3 files have) through the Elixir API, on the tiny Llama and Phi-3 test/data/gen_spm_refs.py
  # writes (committed): llama.cpp's token ids, and transformers' greedy tokens on both engines.
  # The Rust tests (spm_tests.rs) check the tokenizer piece by piece, the logits and a Q8_0 file.
  use ExUnit.Case, async: true

  import ExBurn.PretrainedCase, only: [assert_follows_reference: 4]
  alias ExBurn.LLM

  @data Path.expand("../../data/llm", __DIR__)
  @ref @data |> Path.join("reference_spm.json") |> File.read!() |> ExBurn.JSON.decode!()

  for engine <- [:burn, :candle], arch <- ["llama", "phi3"] do
    test "#{arch} on #{engine}: token ids as llama.cpp's and greedy tokens as transformers'" do
      m = @ref["models"][unquote(arch)]
      model = LLM.load!(Path.join(@data, m["file"]), engine: unquote(engine), device: :cpu)
      assert %LLM{arch: unquote(arch), engine: unquote(engine), vocab_size: 400} = model
      assert 2 in model.eos_token_ids

      for c <- @ref["tokenize"] do
        assert {:ok, c["ids"]} == LLM.tokenize(model, c["text"]), inspect(c["text"])
      end

      for g <- m["generate"] do
        # generation stops at end of sequence (id 2), where the reference went on
        want = Enum.take_while(g["generated_ids"], &(&1 != 2))
        {:ok, r} = LLM.generate(model, g["prompt"], max_tokens: length(g["generated_ids"]), greedy: true)
        assert r.prompt_ids == g["prompt_ids"]
        assert_follows_reference(r.generated_ids, want, g, "#{unquote(arch)} #{unquote(engine)}")
      end
    end
  end
end
