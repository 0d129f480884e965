# Compiled only where Nx is present (Nx calls would warn as undefined); the :nx tag keeps it
# out of runs without Nx either way.
if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Serving.Pretrained.EmbeddingTest do
    # The embedding serving against ExBurn.Embedding.embed/3 (the non-serving path) and the
    # sentence-transformers reference (test/data/pretrained/minilm_reference.json).
    use ExUnit.Case, async: false
    @moduletag :nx

    import ExBurn.PretrainedCase
    alias ExBurn.Embedding

    @model "all-minilm-l6-v2"
    if reason = skip_unless_installed(:embedding, @model), do: @moduletag(skip: reason)

    setup_all do
      if installed(:embedding, @model) do
        %{model: Embedding.load!(@model), cases: reference("minilm_reference.json")["cases"]}
      else
        :ok
      end
    end

    defp unique(prefix), do: :"#{prefix}_#{System.unique_integer([:positive])}"

    defp start_serving(serving, opts \\ []) do
      name = unique(:embedding_serving)
      start_supervised!({Nx.Serving, [serving: serving, name: name] ++ opts})
      name
    end

    # The embedding of `text` embedded alone, outside any serving.
    defp alone(model, text), do: Embedding.embed!(model, text)

    defp assert_embedding(%{embedding: t} = result, expected) do
      assert map_size(result) == 1
      assert Nx.shape(t) == {384}
      assert Nx.type(t) == {:f, 32}
      assert t.data.__struct__ == Nx.BinaryBackend
      # the texts sharing a batch change the kernel (short calls: a pass over the weights on
      # the host; longer ones: gemm), hence the last bits; a mixed-up row is ~0.1 away
      got = Nx.to_flat_list(t)
      assert length(got) == length(expected)
      assert Enum.zip_with(got, expected, &abs(&1 - &2)) |> Enum.max() < 1.0e-6
    end

    test "run/2: a string gives %{embedding: {dim}}, a list a list of them, equal to embed/3 and to sentence-transformers",
         %{model: model, cases: cases} do
      # batch_size 4: the 13 reference texts run as 4 batches, inline
      serving = Embedding.serving(model, batch_size: 4)
      assert %Nx.Serving{} = serving
      texts = Enum.map(cases, & &1["text"])

      results = Nx.Serving.run(serving, texts)
      assert is_list(results) and length(results) == length(cases)

      for {c, result} <- Enum.zip(cases, results) do
        expected = alone(model, c["text"])
        assert_embedding(result, expected)
        cos = cosine(Nx.to_flat_list(result.embedding), c["embedding"])
        assert cos >= 0.9999, "cosine #{cos} for #{inspect(c["text"])}"
      end

      [first | _] = cases
      assert_embedding(Nx.Serving.run(serving, first["text"]), alone(model, first["text"]))

      # embed/3 of a list pads each text to its length-sorted neighbours; the serving embeds
      # equal lengths together, unpadded: the same up to float rounding
      few = Enum.take(texts, 4)
      {:ok, rows} = Embedding.embed(model, few)
      got = serving |> Nx.Serving.run(few) |> Enum.map(&Nx.to_flat_list(&1.embedding))
      for {g, r} <- Enum.zip(got, rows), do: assert(Enum.zip_with(g, r, &abs(&1 - &2)) |> Enum.max() < 1.0e-6)
    end

    test "batched_run from 16 concurrent processes: shared batches, each caller gets its own rows",
         %{model: model, cases: cases} do
      name = start_serving(Embedding.serving(model, batch_size: 32, batch_timeout: 200))
      parent = self()
      handler = "nx-serving-embedding-#{inspect(parent)}"

      :ok = :telemetry.attach(handler, [:nx, :serving, :execute, :stop], &__MODULE__.executed/4, parent)

      on_exit(fn -> :telemetry.detach(handler) end)

      extra =
        for i <- 1..12, do: "request #{i}: " <> String.duplicate("many words make a longer text ", rem(i, 5))

      texts = Enum.map(cases, & &1["text"]) ++ extra

      # 16 callers: 8 send one string, 8 a list of two
      {singles, rest} = Enum.split(texts, 8)
      requests = singles ++ Enum.chunk_every(Enum.take(rest, 16), 2)

      assert length(requests) == 16

      tasks =
        for request <- requests do
          Task.async(fn ->
            receive do
              :go -> {request, Nx.Serving.batched_run(name, request)}
            end
          end)
        end

      Enum.each(tasks, &send(&1.pid, :go))
      answers = Enum.map(tasks, &Task.await(&1, 60_000))

      references = Map.new(cases, &{&1["text"], &1["embedding"]})

      for {request, answer} <- answers do
        pairs =
          if is_binary(request),
            do: [{request, answer}],
            else: Enum.zip(request, answer) |> tap(fn _ -> assert length(answer) == length(request) end)

        for {text, result} <- pairs do
          assert_embedding(result, alone(model, text))

          if ref = references[text] do
            assert cosine(Nx.to_flat_list(result.embedding), ref) >= 0.9999
          end
        end
      end

      executed = collect_executed([])
      total = requests |> Enum.map(&length(List.wrap(&1))) |> Enum.sum()
      assert Enum.sum(Enum.map(executed, & &1.rows)) == total
      # no request is bigger than 2 texts, so a batch of more rows held several callers
      assert Enum.max(Enum.map(executed, & &1.rows)) > 2, "batches: #{inspect(executed)}"
      assert length(executed) < length(requests)
    end

    def executed(_event, _measurements, %{module: module, metadata: metadata}, parent) do
      if module == ExBurn.Serving.Pretrained.Embedding, do: send(parent, {:executed, metadata})
    end

    defp collect_executed(acc) do
      receive do
        {:executed, metadata} -> collect_executed([metadata | acc])
      after
        200 -> acc
      end
    end

    test ":sequence_length pads to that length and truncates longer texts as the tokenizer does",
         %{model: model} do
      serving = Embedding.serving(model, sequence_length: 16)

      words =
        ~w(apple river mountain house green table music window garden yellow winter paper horse silver ocean forest)

      # one token per word: [CLS] + 14 words + [SEP] is 16 tokens
      {:ok, [ids]} = Embedding.tokenize(model, [Enum.join(Enum.take(words, 14), " ")])
      assert length(ids) == 16

      long = Enum.join(words, " ")
      kept = Enum.join(Enum.take(words, 14), " ")
      assert_embedding(Nx.Serving.run(serving, long), alone(model, kept))
      refute alone(model, long) == alone(model, kept)

      # shorter texts are untouched
      assert_embedding(Nx.Serving.run(serving, "a short one"), alone(model, "a short one"))
    end

    test "bad input raises ExBurn.Error in the caller; the serving process lives on", %{model: model} do
      serving = Embedding.serving(model, batch_size: 8)
      name = start_serving(serving)
      pid = Process.whereis(name)

      for {input, kind} <- [
            {[], :empty_input},
            {42, :argument},
            {["ok", :atom], :argument},
            {%{text: "x"}, :argument}
          ] do
        assert %ExBurn.Error{details: %{kind: ^kind}} = catch_error(Nx.Serving.run(serving, input))
        assert %ExBurn.Error{details: %{kind: ^kind}} = catch_error(Nx.Serving.batched_run(name, input))
      end

      # not UTF-8: the tokenizer refuses it
      assert %ExBurn.Error{} = catch_error(Nx.Serving.batched_run(name, [<<0xFF, 0xFE>>]))

      assert Process.alive?(pid)
      assert_embedding(Nx.Serving.batched_run(name, "still serving"), alone(model, "still serving"))

      # build options
      assert_raise ExBurn.Error, ~r/unknown options/, fn -> Embedding.serving(model, batch: 3) end

      assert_raise ExBurn.Error, ~r/:sequence_length/, fn ->
        Embedding.serving(model, sequence_length: 10_000)
      end

      assert_raise ExBurn.Error, ~r/:batch_size/, fn -> Embedding.serving(model, batch_size: 0) end
      assert_raise ExBurn.Error, ~r/ExBurn.Embedding model/, fn -> Embedding.serving(:not_a_model) end
    end
  end

  defmodule ExBurn.Serving.Pretrained.LLMTest do
    # The generation serving against ExBurn.LLM.generate/3 (the non-serving path).
    use ExUnit.Case, async: false
    @moduletag :nx

    import ExBurn.PretrainedCase
    alias ExBurn.LLM

    @model "smollm2-135m-instruct"
    if reason = skip_unless_installed(:llm, @model), do: @moduletag(skip: reason)

    @prompts [
      "The capital of France is",
      [%{role: "user", content: "Name three colours."}]
    ]

    setup_all do
      if installed(:llm, @model), do: %{model: LLM.load!(@model)}, else: :ok
    end

    defp start_serving(serving, opts \\ []) do
      name = :"llm_serving_#{System.unique_integer([:positive])}"
      start_supervised!({Nx.Serving, [serving: serving, name: name] ++ opts})
      name
    end

    defp expected(model, prompt, opts) do
      {:ok, r} = LLM.generate(model, prompt, opts)

      %{
        text: r.text,
        finish_reason: r.finish_reason,
        token_summary: %{input: r.usage.prompt_tokens, output: r.usage.completion_tokens, padding: 0}
      }
    end

    test "greedy generation: run and batched_run give generate/3's text and token counts", %{model: model} do
      opts = [max_tokens: 16, greedy: true]
      serving = LLM.serving(model, opts)
      name = start_serving(serving)

      for prompt <- @prompts do
        want = expected(model, prompt, opts)
        assert want.text != ""
        assert %{results: [result]} = Nx.Serving.run(serving, prompt)
        assert result == want
        assert result.token_summary.output in 1..16
      end

      # concurrently, through the serving process
      results =
        @prompts
        |> Enum.map(&Task.async(fn -> Nx.Serving.batched_run(name, &1) end))
        |> Enum.map(&Task.await(&1, 60_000))

      for {prompt, %{results: [result]}} <- Enum.zip(@prompts, results),
          do: assert(result == expected(model, prompt, opts))

      # options per request override the serving's
      assert %{results: [short]} = Nx.Serving.batched_run(name, %{text: hd(@prompts), max_tokens: 3})
      assert short == expected(model, hd(@prompts), max_tokens: 3, greedy: true)
      assert short.token_summary.output == 3
    end

    test "stream: true gives the text in pieces, joined equal to the non-streaming text", %{model: model} do
      opts = [max_tokens: 16, greedy: true]
      serving = LLM.serving(model, [stream: true] ++ opts)
      name = start_serving(LLM.serving(model, [stream: true, stream_done: true] ++ opts))

      for prompt <- @prompts do
        want = expected(model, prompt, opts)

        pieces = serving |> Nx.Serving.run(prompt) |> Enum.to_list()
        assert Enum.all?(pieces, &(is_binary(&1) and &1 != "" and String.valid?(&1)))
        assert length(pieces) > 1
        assert Enum.join(pieces) == want.text

        events = name |> Nx.Serving.batched_run(prompt) |> Enum.to_list()
        {texts, [done]} = Enum.split(events, -1)
        assert Enum.join(texts) == want.text
        assert done == {:done, Map.take(want, [:token_summary, :finish_reason])}
      end
    end

    test "partitions: 2 runs two generations at once", %{model: model} do
      parent = self()
      handler = "nx-serving-llm-#{inspect(parent)}"

      events = [[:nx, :serving, :execute, :start], [:nx, :serving, :execute, :stop]]
      :ok = :telemetry.attach_many(handler, events, &__MODULE__.execute_event/4, parent)

      on_exit(fn -> :telemetry.detach(handler) end)

      overlapped? = fn partitions ->
        name = start_serving(LLM.serving(model, max_tokens: 12, greedy: true, partitions: partitions))

        [a, b] =
          for p <- ["One, two, three,", "Once upon a time"] do
            Task.async(fn -> Nx.Serving.batched_run(name, p) end)
          end
          |> Enum.map(&Task.await(&1, 60_000))

        assert a == %{results: [expected(model, "One, two, three,", max_tokens: 12, greedy: true)]}
        assert %{results: [%{token_summary: %{output: 12}}]} = b
        events = for _ <- 1..4, do: assert_receive({event, _at} when event in [:start, :stop], 5_000)
        # the second generation started before the first stopped
        Enum.map(events, &elem(&1, 0)) == [:start, :start, :stop, :stop]
      end

      assert overlapped?.(2)
      refute overlapped?.(1)
    end

    def execute_event([_, _, _, event], _measurements, %{module: module}, parent) do
      if module == ExBurn.Serving.Pretrained.LLM, do: send(parent, {event, System.monotonic_time()})
    end

    test "bad input raises ExBurn.Error in the caller; the serving process lives on", %{model: model} do
      serving = LLM.serving(model, max_tokens: 4, greedy: true)
      stream_serving = LLM.serving(model, max_tokens: 4, greedy: true, stream: true)
      name = start_serving(serving)
      stream_name = start_serving(stream_serving)

      for input <- [42, [], ["not", "messages"], %{text: "x", bogus: 1}, %{prompt: "x"}] do
        assert %ExBurn.Error{} = catch_error(Nx.Serving.run(serving, input))
        assert %ExBurn.Error{} = catch_error(Nx.Serving.batched_run(name, input))
        assert %ExBurn.Error{} = catch_error(Nx.Serving.batched_run(stream_name, input))
      end

      # an empty prompt passes the client checks and fails in the model: the error comes back
      assert %ExBurn.Error{details: %{kind: :empty_prompt}} = catch_error(Nx.Serving.run(serving, ""))
      assert %ExBurn.Error{details: %{kind: :empty_prompt}} = catch_error(Nx.Serving.batched_run(name, ""))

      assert %ExBurn.Error{details: %{kind: :empty_prompt}} =
               catch_error(stream_name |> Nx.Serving.batched_run("") |> Enum.to_list())

      assert Process.alive?(Process.whereis(name)) and Process.alive?(Process.whereis(stream_name))
      assert %{results: [%{token_summary: %{output: 4}}]} = Nx.Serving.batched_run(name, "Hello")
      assert [_ | _] = stream_name |> Nx.Serving.batched_run("Hello") |> Enum.to_list()

      # build options
      assert_raise ExBurn.Error, ~r/unknown options/, fn -> LLM.serving(model, max_token: 3) end
      assert_raise ExBurn.Error, ~r/:stream/, fn -> LLM.serving(model, stream: :yes) end
      assert_raise ExBurn.Error, ~r/option :temperature/, fn -> LLM.serving(model, temperature: "hot") end
      assert_raise ExBurn.Error, ~r/ExBurn.LLM model/, fn -> LLM.serving(%{}) end
    end
  end

  defmodule ExBurn.Serving.Pretrained.RerankTest do
    # The rerank serving against ExBurn.Rerank.score/4, on the tiny cross-encoder of
    # test/data/encoders/ (committed: never skips).
    use ExUnit.Case, async: false
    @moduletag :nx

    import ExBurn.TestHelpers, only: [product_tolerance: 1]
    alias ExBurn.Rerank

    @dir Path.expand("../../data/encoders/tiny-xlm-roberta-reranker", __DIR__)

    test "scores equal score/4's, inline and batched across callers" do
      model = Rerank.load!(@dir, engine: :burn)
      docs = ["The quick fox sleeps.", "Der Fuchs schläft.", "fox"]
      {:ok, want} = Rerank.score(model, "where does the fox sleep", docs)

      serving = Rerank.serving(model)
      assert %{scores: t} = Nx.Serving.run(serving, {"where does the fox sleep", docs})
      assert {Nx.shape(t), Nx.type(t)} == {{3}, {:f, 32}}
      assert Nx.to_flat_list(t) == want

      name = :"rerank_serving_#{System.unique_integer([:positive])}"
      start_supervised!({Nx.Serving, serving: serving, name: name, batch_timeout: 5})

      results =
        1..4
        |> Task.async_stream(fn n ->
          Nx.Serving.batched_run(name, {"where does the fox sleep", Enum.take(docs, rem(n, 3) + 1)})
        end)
        |> Enum.map(fn {:ok, %{scores: t}} -> Nx.to_flat_list(t) end)

      # a document scored alone may differ in the last bits from its score beside others (more
      # on a GPU, whose products run TF32 kernels)
      for {got, n} <- Enum.zip(results, 1..4), {g, w} <- Enum.zip(got, Enum.take(want, rem(n, 3) + 1)) do
        assert_in_delta g, w, product_tolerance(1.0e-6)
      end

      assert Enum.map(results, &length/1) == [2, 3, 1, 2]
      {:ok, raw} = Rerank.score(model, "q", ["a"], raw: true)
      assert Nx.to_flat_list(Nx.Serving.run(Rerank.serving(model, raw: true), {"q", ["a"]}).scores) == raw
    end

    test "bad input raises ExBurn.Error in the caller" do
      serving = Rerank.serving(Rerank.load!(@dir, engine: :burn))
      assert_raise ExBurn.Error, ~r/query, documents/, fn -> Nx.Serving.run(serving, "just a string") end
      assert_raise ExBurn.Error, ~r/non-empty list/, fn -> Nx.Serving.run(serving, {"q", []}) end
      assert_raise ExBurn.Error, ~r/ExBurn.Rerank model/, fn -> Rerank.serving(%{}) end
      assert_raise ExBurn.Error, ~r/:raw/, fn -> Rerank.serving(Rerank.load!(@dir, engine: :burn), raw: 1) end
    end
  end
else
  defmodule ExBurn.Serving.Pretrained.WithoutNxTest do
    # Without Nx the builders exist and say what is missing.
    use ExUnit.Case, async: true

    test "serving/2 raises ExBurn.Error naming Nx" do
      assert_raise ExBurn.Error, ~r/Nx is not loaded/, fn -> ExBurn.Embedding.serving(%ExBurn.Embedding{}) end

      assert_raise ExBurn.Error, ~r/Nx is not loaded/, fn ->
        ExBurn.LLM.serving(%ExBurn.LLM{}, stream: true)
      end
    end
  end
end
