defmodule ExBurn.Pretrained.WarmUpTest do
  # Warming models up before traffic: ExBurn.LLM.warm_up/2 and ExBurn.Embedding.warm_up/2 on
  # the committed tiny models, the scheduler's :warmup, and the servings' (with Nx). A warm-up
  # runs each batch size once and leaves the model's answers as they were.
  use ExUnit.Case, async: true

  alias ExBurn.{Embedding, Error, LLM}
  alias ExBurn.LLM.Scheduler

  @llm Path.expand("../../data/llm/tiny-qwen2.F16.gguf", __DIR__)
  @encoder Path.expand("../../data/encoders/tiny-bert-max-weightedmean", __DIR__)
  @prompt "Once upon a time"

  for engine <- [:burn, :candle] do
    test "LLM.warm_up/2 runs each batch size and changes no answer (#{engine})" do
      model = LLM.load!(@llm, engine: unquote(engine), device: :cpu)
      {:ok, cold} = LLM.generate(model, @prompt, max_tokens: 8, greedy: true)

      assert {:ok, %{batch_sizes: [1, 3, 2], ms: ms}} = LLM.warm_up(model, batch_sizes: [1, 3, 2, 3])
      assert is_integer(ms) and ms >= 0
      assert {:ok, %{batch_sizes: [1]}} = LLM.warm_up(model)
      assert {:ok, warm} = LLM.generate(model, @prompt, max_tokens: 8, greedy: true)
      assert warm.generated_ids == cold.generated_ids
    end
  end

  test "bad warm-up options and arguments are errors" do
    model = LLM.load!(@llm, engine: :burn, device: :cpu)

    for sizes <- [[0], [], [2.0], :all] do
      assert {:error, %Error{op: :llm_warm_up, details: %{kind: :invalid_option, option: :warmup}}} =
               LLM.warm_up(model, batch_sizes: sizes)
    end

    assert {:error, %Error{details: %{kind: :invalid_option, option: :sizes}}} =
             LLM.warm_up(model, sizes: [1])

    assert {:error, %Error{}} = LLM.warm_up(:not_a_model)
    assert {:error, %Error{}} = Embedding.warm_up(:not_a_model)
  end

  test "Embedding.warm_up/2 embeds at each batch size and changes no embedding" do
    model = Embedding.load!(@encoder, device: :cpu)
    {:ok, cold} = Embedding.embed(model, ["a warm day", "cold"])
    assert {:ok, %{batch_sizes: [1, 4]}} = Embedding.warm_up(model, batch_sizes: [1, 4])
    assert {:ok, ^cold} = Embedding.embed(model, ["a warm day", "cold"])

    assert {:error, %Error{op: :embed_warm_up, details: %{kind: :invalid_option}}} =
             Embedding.warm_up(model, batch_sizes: [-1])
  end

  test "a scheduler with warmup: true runs every batch size up to max_concurrent first" do
    model = LLM.load!(@llm, engine: :burn, device: :cpu)
    server = start_supervised!({Scheduler, model: model, max_concurrent: 3, warmup: true})
    assert %{warmup: %{batch_sizes: [1, 2, 3], ms: _}} = Scheduler.info(server)

    {:ok, direct} = LLM.generate(model, @prompt, max_tokens: 8, greedy: true)
    assert {:ok, %{text: text}} = Scheduler.generate(server, @prompt, max_tokens: 8, greedy: true)
    assert text == direct.text

    quiet = start_supervised!({Scheduler, model: model, name: :no_warmup_scheduler}, id: :quiet)
    assert %{warmup: nil} = Scheduler.info(quiet)
    listed = start_supervised!({Scheduler, model: model, warmup: [2], name: :listed}, id: :listed)
    assert %{warmup: %{batch_sizes: [2]}} = Scheduler.info(listed)

    assert_raise Error, ~r/from 1 to 3/, fn -> Scheduler.start_link(model, max_concurrent: 3, warmup: [4]) end
  end

  if Code.ensure_loaded?(Nx) do
    test "the servings' warmup: the embedding serving process and the LLM serving's scheduler" do
      model = Embedding.load!(@encoder, device: :cpu)
      name = :"warm_embedding_#{System.unique_integer([:positive])}"

      start_supervised!(
        {Nx.Serving, serving: Embedding.serving(model, batch_size: 4, warmup: true), name: name}
      )

      {:ok, [want]} = Embedding.embed(model, ["warm"])
      %{embedding: got} = Nx.Serving.batched_run(name, "warm")

      assert_in_delta Nx.to_flat_list(got)
                      |> Enum.zip(want)
                      |> Enum.map(fn {a, b} -> abs(a - b) end)
                      |> Enum.max(),
                      0.0,
                      1.0e-6

      llm = LLM.load!(@llm, engine: :burn, device: :cpu)
      name = :"warm_llm_#{System.unique_integer([:positive])}"
      serving = LLM.serving(llm, max_tokens: 8, greedy: true, partitions: 2, warmup: true)
      start_supervised!({Nx.Serving, serving: serving, name: name}, id: :llm_serving)
      {:ok, direct} = LLM.generate(llm, @prompt, max_tokens: 8, greedy: true)
      assert %{results: [%{text: text}]} = Nx.Serving.batched_run(name, @prompt)
      assert text == direct.text

      assert_raise Error, ~r/from 1 to 2/, fn -> LLM.serving(llm, partitions: 2, warmup: [3]) end
      assert_raise Error, ~r/warm-up batch sizes/, fn -> Embedding.serving(model, warmup: :yes) end
    end
  end
end
