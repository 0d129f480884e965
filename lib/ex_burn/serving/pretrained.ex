defmodule ExBurn.Serving.Pretrained do
  @moduledoc """
  `Nx.Serving` builders for the pre-trained models: `ExBurn.Embedding.serving/2`,
  `ExBurn.LLM.serving/2` and `ExBurn.Rerank.serving/2`. They need Nx; without it they raise `ExBurn.Error` (use
  `ExBurn.Serving.Batcher` for embeddings, `ExBurn.LLM.stream/3` for generation).

  Both servings work as Bumblebee's do: run one inline with `Nx.Serving.run/2`, or start it
  under a name (`{Nx.Serving, serving: serving, name: MyServing}`) and call
  `Nx.Serving.batched_run/2`, which batches concurrent callers (and reaches servings on other
  connected nodes). Outputs are tensors on `Nx.BinaryBackend` (host memory, safe to send to
  other nodes; `Nx.backend_transfer/2` moves them anywhere).

  ## Text embedding (`ExBurn.Embedding.serving/2`)

  Input: a string, or a non-empty list of strings. Output, as `Bumblebee.Text.text_embedding/3`:
  `%{embedding: tensor}` for a string (an f32 tensor of shape `{dim}`), a list of such maps for
  a list.

  The caller's process tokenises its texts (special tokens included, truncated at the model's
  maximum length, as `ExBurn.Embedding.embed/3`) and pads the ids into an `Nx.Batch` of
  `{n, sequence_length}` (u32 `input_ids` and a u8 `attention_mask`), so batches from different
  callers stack. The serving strips the padding again and embeds rows of equal token count
  together, without padding: an embedding never depends on which other texts shared its batch,
  and equals `ExBurn.Embedding.embed(model, text)` of the text alone (bit for bit on the CPU,
  with either engine; a GPU kernel may round differently for different batch sizes). `embed/3`
  of a list pads each text to its length-sorted neighbours, which can move the last bits.

  Options:

    * `:batch_size` - the most texts per batch (default 32); a list longer than this is split
    * `:batch_timeout` - how long, in ms, a batch waits for more callers (default 10)
    * `:sequence_length` - the padded length of each row (default the model's `max_seq_len`).
      Texts with more tokens keep their first `sequence_length - 1` tokens and their last one
      (the closing special token), as a tokenizer truncating at that length does
    * `:partitions` - how many batches run at once (default 1), each in its own task
    * `:warmup` - `true` embeds a text at batch sizes 1 and `:batch_size` (a list: those
      sizes) in the serving process before it takes batches (`ExBurn.Embedding.warm_up/2`;
      for GPUs, which compile kernels per shape on first use). Default `false`; an inline
      `Nx.Serving.run/2` never warms up

  ## Text generation (`ExBurn.LLM.serving/2`)

  Input: a prompt (a string, or a list of chat messages as `ExBurn.LLM.generate/3` takes), or a
  map `%{text: prompt}` with any generation options for this request only (they override the
  serving's). Output, as `Bumblebee.Text.generation/4`:
  `%{results: [%{text: text, token_summary: %{input: n, output: m, padding: 0}, finish_reason: reason}]}`.
  A list of strings is not a batch of prompts here (a list is a chat); send prompts
  concurrently with `Nx.Serving.batched_run/2` instead.

  A started serving (`batched_run/2`) owns an `ExBurn.LLM.Scheduler`: each request is a
  generation of its own, and up to `:partitions` of them (default 16) run together in the
  scheduler's batched steps (continuous batching: a request joins at the next step and leaves
  when done), each with the text it would get alone (on GPUs, up to near ties: the server
  guide says why). `Nx.Serving.run/2` (inline) runs
  `ExBurn.LLM.generate/3` in the caller.

  With `stream: true`, `Nx.Serving.run/2` and `Nx.Serving.batched_run/2` return a lazy stream of
  text pieces (valid UTF-8; joined, the text the non-streaming serving returns), delivered as
  the model produces them through Nx.Serving's streaming hooks (the hook `:token`, called by the
  serving's task for each piece). The stream must be consumed by the process that made the
  call. `stream_done: true` adds a last element
  `{:done, %{token_summary: ..., finish_reason: ...}}`. A consumer that stops early does not stop
  the generation (Nx.Serving has no way to tell the serving); `ExBurn.LLM.stream/3` does.

  Options: the generation options of `ExBurn.LLM.generate/3` (`:max_tokens`, `:greedy`,
  `:temperature`, `:top_k`, `:top_p`, `:seed`, `:stop`, `:stop_token_ids`, `:ignore_eos`), `:stream`,
  `:stream_done`, `:partitions` and `:warmup` (`true`: the started serving's scheduler runs
  every batch size from 1 to `:partitions` once before it takes requests, as
  `ExBurn.LLM.Scheduler`'s `:warmup`; a list: those sizes; default `false`). Without `:seed`,
  each request samples with a seed of its own.

  ## Reranking (`ExBurn.Rerank.serving/2`)

  Input: `{query, documents}` (a string and a list of strings). Output: `%{scores: tensor}`, an
  f32 tensor of shape `{length(documents)}`, equal to `ExBurn.Rerank.score/4`'s scores. Each
  request is scored on its own (batch size 1); `:partitions` (default 1) sets how many run at
  once. Options: `:raw` (the logits, as `score/4` takes it) and `:partitions`.

  ## Errors

  Bad input (not a string, an empty list, unknown options) raises `ExBurn.Error` in the calling
  process, before anything reaches the serving. A failure while running (an over-long prompt, an
  engine error) also raises `ExBurn.Error` in the caller, for the requests it concerns; the
  serving process goes on serving.
  """

  alias ExBurn.Error

  @doc false
  def embedding(model, opts), do: call(ExBurn.Serving.Pretrained.Embedding, ExBurn.Embedding, model, opts)

  @doc false
  def llm(model, opts), do: call(ExBurn.Serving.Pretrained.LLM, ExBurn.LLM, model, opts)

  @doc false
  def rerank(model, opts), do: call(ExBurn.Serving.Pretrained.Rerank, ExBurn.Rerank, model, opts)

  # The Nx path is compiled only when Nx is loaded; `apply/3` keeps this module warning-free
  # without it.
  defp call(module, caller, model, opts) do
    if Code.ensure_loaded?(module),
      do: apply(module, :build, [model, opts]),
      else:
        raise(Error,
          op: :serving,
          reason:
            "Nx is not loaded; Nx.Serving builders need Nx (use ExBurn.Serving.Batcher or ExBurn.LLM.stream/3)",
          details: %{function: {caller, :serving, 2}}
        )
  end
end

if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Serving.Pretrained.Util do
    @moduledoc false
    # What both servings share: option checks, batch access, errors.

    alias ExBurn.Error

    def options!(opts, allowed), do: ExBurn.Tensor.Util.opts!(:serving, opts, allowed)

    # Partitions the Nx way for a serving that does not compile: Nx.Defn.Evaluator answers
    # `__partitions_options__/1` with `:max_concurrency` copies of the options.
    def partition_options(partitions), do: [compiler: Nx.Defn.Evaluator, max_concurrency: partitions]

    # The batch's stacked entries (Nx.Batch is a lazy container of one template).
    def materialize(%Nx.Batch{} = batch) do
      {container, _} = Nx.LazyContainer.traverse(batch, nil, fn _template, fun, acc -> {fun.(), acc} end)
      container
    end

    def host_binary(binary, type, shape),
      do: binary |> Nx.from_binary(type, backend: Nx.BinaryBackend) |> Nx.reshape(shape)

    def fail!(reason, details), do: raise(Error, op: :serving, reason: reason, details: details)
  end

  defmodule ExBurn.Serving.Pretrained.Embedding do
    @moduledoc false
    # ExBurn.Embedding.serving/2 (see ExBurn.Serving.Pretrained).
    @behaviour Nx.Serving

    alias ExBurn.{Embedding, Pretrained}
    import ExBurn.Serving.Pretrained.Util

    @options [:batch_size, :batch_timeout, :sequence_length, :partitions, :warmup]

    def build(%Embedding{} = model, opts) do
      opts = options!(opts, @options)
      batch_size = ExBurn.Tensor.Util.int_option!(:serving, opts, :batch_size, 32)
      batch_timeout = ExBurn.Tensor.Util.int_option!(:serving, opts, :batch_timeout, 10, 0)
      partitions = ExBurn.Tensor.Util.int_option!(:serving, opts, :partitions, 1)
      seq_len = sequence_length!(opts, model)

      warmup =
        ExBurn.Pretrained.WarmUp.sizes!(
          :serving,
          opts[:warmup],
          ExBurn.Pretrained.WarmUp.embedder_sizes(batch_size)
        )

      Nx.Serving.new(__MODULE__, {model, warmup}, partition_options(partitions))
      |> Nx.Serving.batch_size(batch_size)
      |> Nx.Serving.process_options(batch_timeout: batch_timeout, partitions: partitions > 1)
      |> Nx.Serving.client_preprocessing(&preprocess(model, seq_len, &1))
      |> Nx.Serving.client_postprocessing(&postprocess/2)
    end

    def build(other, _opts), do: fail!("expected an ExBurn.Embedding model", %{got: other})

    defp sequence_length!(opts, model) do
      case Keyword.get(opts, :sequence_length, model.max_seq_len) do
        n when is_integer(n) and n >= 2 and n <= model.max_seq_len ->
          n

        other ->
          fail!(":sequence_length must be an integer from 2 to the model's max_seq_len", %{
            option: :sequence_length,
            got: other,
            max_seq_len: model.max_seq_len
          })
      end
    end

    ## Serving callbacks

    @impl true
    # a serving process warms its model before Nx.Serving lets batches reach it
    def init(:process, {model, [_ | _] = warmup}, _partitions) do
      with {:error, error} <- Embedding.warm_up(model, batch_sizes: warmup), do: raise(error)
      {:ok, model}
    end

    def init(_type, {model, _warmup}, _partitions), do: {:ok, model}

    @impl true
    def handle_batch(batch, _partition, model), do: {:execute, fn -> execute(model, batch) end, model}

    # Strips each row's padding and embeds rows of equal length together (no padding, so a
    # row's embedding does not depend on its batch); rows of padding (no tokens) get zeros.
    defp execute(model, batch) do
      %{input_ids: ids, attention_mask: mask} = materialize(batch)
      {n, seq_len} = Nx.shape(ids)
      rows = rows(Nx.to_binary(ids), Nx.to_binary(mask), n, seq_len)

      groups =
        rows |> Enum.with_index() |> Enum.reject(&(elem(&1, 0) == [])) |> Enum.group_by(&length(elem(&1, 0)))

      zero = :binary.copy(<<0.0::float-32-native>>, model.dim)

      {vectors, error} =
        Enum.reduce(groups, {%{}, nil}, fn {_length, group}, {acc, error} ->
          case embed_ids(model, Enum.map(group, &elem(&1, 0))) do
            {:ok, bin} ->
              split = for <<v::binary-size(model.dim * 4) <- bin>>, do: v
              {Enum.zip(Enum.map(group, &elem(&1, 1)), split) |> Map.new() |> Map.merge(acc), error}

            {:error, e} ->
              {acc, error || e}
          end
        end)

      ok =
        for {row, i} <- Enum.with_index(rows), do: if(row == [] or Map.has_key?(vectors, i), do: 1, else: 0)

      bin = for i <- 0..(n - 1)//1, into: <<>>, do: Map.get(vectors, i, zero)

      output = {host_binary(bin, :f32, {n, model.dim}), host_binary(:binary.list_to_bin(ok), :u8, {n})}
      {output, %{rows: n, calls: map_size(groups), error: error}}
    end

    defp rows(ids, mask, n, seq_len) do
      for r <- 0..(n - 1)//1 do
        count = for <<1 <- binary_part(mask, r * seq_len, seq_len)>>, reduce: 0, do: (c -> c + 1)
        for <<id::32-native <- binary_part(ids, r * seq_len * 4, count * 4)>>, do: id
      end
    end

    defp embed_ids(model, rows) do
      Pretrained.call(Map.from_struct(model), :embedder_embed_ids, &ExBurn.Native.embedder_load/2, fn ref ->
        ExBurn.Native.embedder_embed_ids(ref, rows)
      end)
      |> case do
        {:ok, {bin, _dim}, _model} -> {:ok, bin}
        {:error, _} = error -> error
      end
    end

    ## Client side

    defp preprocess(model, seq_len, input) do
      {texts, info} = texts!(input)

      ids =
        case Embedding.tokenize(model, texts) do
          {:ok, ids} -> ids
          {:error, e} -> raise e
        end

      ids = Enum.map(ids, &truncate(&1, seq_len))
      n = length(ids)

      ids_bin =
        for row <- ids, into: <<>>, do: pad(for(id <- row, into: <<>>, do: <<id::32-native>>), seq_len * 4)

      mask_bin = for row <- ids, into: <<>>, do: pad(:binary.copy(<<1>>, length(row)), seq_len)

      batch =
        Nx.Batch.concatenate([
          %{
            input_ids: host_binary(ids_bin, :u32, {n, seq_len}),
            attention_mask: host_binary(mask_bin, :u8, {n, seq_len})
          }
        ])

      {batch, info}
    end

    defp texts!(text) when is_binary(text), do: {[text], :single}

    defp texts!([_ | _] = texts) do
      if Enum.all?(texts, &is_binary/1),
        do: {texts, :list},
        else: input_error(texts, :argument)
    end

    defp texts!([]), do: input_error([], :empty_input)
    defp texts!(other), do: input_error(other, :argument)

    defp input_error(got, kind),
      do: fail!("the input must be a string or a non-empty list of strings", %{got: got, kind: kind})

    # As a tokenizer truncating at `length`: the first tokens and the closing special token.
    defp truncate(row, seq_len) when length(row) <= seq_len, do: row
    defp truncate(row, seq_len), do: Enum.take(row, seq_len - 1) ++ [List.last(row)]

    defp pad(bin, size), do: bin <> :binary.copy(<<0>>, size - byte_size(bin))

    defp postprocess({{embeddings, ok}, metadata}, info) do
      if Enum.any?(Nx.to_flat_list(ok), &(&1 == 0)) do
        raise metadata.error ||
                ExBurn.Error.exception(
                  op: :serving,
                  reason: "the batch holding this input failed",
                  details: %{kind: :batch_failed}
                )
      end

      {n, dim} = Nx.shape(embeddings)
      rows = for i <- 0..(n - 1), do: %{embedding: Nx.reshape(Nx.slice_along_axis(embeddings, i, 1), {dim})}

      case info do
        :single -> hd(rows)
        :list -> rows
      end
    end
  end

  defmodule ExBurn.Serving.Pretrained.LLM do
    @moduledoc false
    # ExBurn.LLM.serving/2 (see ExBurn.Serving.Pretrained). A request travels to the serving
    # as its prompt and options (`term_to_binary`) in a u8 tensor: batches of one, so the rows
    # never need to stack.
    @behaviour Nx.Serving

    alias ExBurn.LLM
    import ExBurn.Serving.Pretrained.Util

    @generation LLM.generation_options()
    @options [:stream, :stream_done, :partitions, :warmup | @generation]

    def build(%LLM{} = model, opts) do
      opts = options!(opts, @options)
      partitions = ExBurn.Tensor.Util.int_option!(:serving, opts, :partitions, 16)
      stream? = boolean!(opts, :stream)
      done? = boolean!(opts, :stream_done)
      generation = Keyword.take(opts, @generation)
      # checked now, so a bad option fails at build time rather than on every request
      with {:error, e} <- LLM.start_args("", generation), do: raise(e)

      warmup =
        ExBurn.Pretrained.WarmUp.sizes!(:serving, opts[:warmup], Enum.to_list(1..partitions), partitions)

      serving =
        Nx.Serving.new(
          __MODULE__,
          %{model: model, stream: stream?, warmup: warmup},
          partition_options(partitions)
        )
        |> Nx.Serving.batch_size(1)
        |> Nx.Serving.process_options(partitions: partitions > 1)
        |> Nx.Serving.client_preprocessing(&preprocess(generation, &1))

      if stream? do
        serving
        |> Nx.Serving.streaming(hooks: [:token])
        |> Nx.Serving.client_postprocessing(&stream_postprocess(&1, &2, done?))
      else
        Nx.Serving.client_postprocessing(serving, &postprocess/2)
      end
    end

    def build(other, _opts), do: fail!("expected an ExBurn.LLM model", %{got: other})

    defp boolean!(opts, key) do
      case Keyword.get(opts, key, false) do
        b when is_boolean(b) -> b
        other -> fail!("#{inspect(key)} must be a boolean", %{option: key, got: other})
      end
    end

    ## Serving callbacks

    # With streaming, each partition's options carry the `:token` hook Nx.Serving installed. A
    # serving process gets a scheduler that batches its partitions' generations (linked: it
    # lives as long as the serving); an inline run generates in the caller.
    @impl true
    def init(type, arg, partitions) do
      hooks =
        partitions |> Enum.with_index() |> Map.new(fn {opts, i} -> {i, get_in(opts, [:hooks, :token])} end)

      scheduler =
        if type == :process do
          opts = [max_concurrent: length(partitions), warmup: arg.warmup != [] and arg.warmup]

          case ExBurn.LLM.Scheduler.start_link(arg.model, opts) do
            {:ok, pid} -> pid
            {:error, error} -> raise error
          end
        end

      {:ok, Map.merge(arg, %{hooks: hooks, scheduler: scheduler})}
    end

    @impl true
    def handle_batch(batch, partition, state) do
      {:execute, fn -> execute(state, Map.get(state.hooks, partition), batch) end, state}
    end

    defp execute(%{model: model, stream: stream?, scheduler: scheduler}, hook, batch) do
      {prompt, opts} = batch |> materialize() |> Nx.to_binary() |> :erlang.binary_to_term([:safe])

      if stream?,
        do: stream(model, scheduler, prompt, opts, hook),
        else: generate(model, scheduler, prompt, opts)
    end

    defp generate(model, scheduler, prompt, opts) do
      result =
        if scheduler,
          do: ExBurn.LLM.Scheduler.generate(scheduler, prompt, opts),
          else: LLM.generate(model, prompt, opts)

      case result do
        {:ok, r} ->
          {count(r.usage.completion_tokens),
           %{text: r.text, finish_reason: r.finish_reason, token_summary: summary(r.usage)}}

        {:error, e} ->
          {count(0), {:error, e}}
      end
    end

    defp stream(model, scheduler, prompt, opts, hook) do
      events =
        if scheduler,
          do: ExBurn.LLM.Scheduler.stream_events(scheduler, prompt, opts),
          else: LLM.stream_events(model, prompt, opts)

      done =
        events
        |> Enum.reduce(nil, fn
          {:text, piece}, acc ->
            hook.(host_binary(piece, :u8, {1, byte_size(piece)}))
            acc

          {:done, done}, _acc ->
            done
        end)

      {count(done.usage.completion_tokens),
       %{finish_reason: done.finish_reason, token_summary: summary(done.usage)}}
    rescue
      e in ExBurn.Error -> {count(0), {:error, e}}
    end

    defp count(n), do: Nx.tensor([n], type: :s64, backend: Nx.BinaryBackend)

    defp summary(usage), do: %{input: usage.prompt_tokens, output: usage.completion_tokens, padding: 0}

    ## Client side

    defp preprocess(generation, input) do
      {prompt, opts} = request!(input, generation)
      with {:error, e} <- LLM.start_args(prompt, opts), do: raise(e)
      payload = :erlang.term_to_binary({prompt, opts})
      {Nx.Batch.stack([host_binary(payload, :u8, {byte_size(payload)})]), :single}
    end

    defp request!(%{text: prompt} = request, generation) do
      opts = request |> Map.delete(:text) |> Enum.to_list()
      {prompt, Keyword.merge(generation, opts)}
    end

    defp request!(prompt, generation) when is_binary(prompt) or is_list(prompt), do: {prompt, generation}

    defp request!(other, _generation),
      do:
        fail!("the input must be a prompt (a string or chat messages) or a map with :text", %{
          got: other,
          kind: :invalid_prompt
        })

    defp postprocess({_count, {:error, e}}, _info), do: raise(e)
    defp postprocess({_count, result}, _info), do: %{results: [result]}

    defp stream_postprocess(events, _info, done?) do
      Stream.transform(events, nil, fn
        {:token, piece}, acc -> {[Nx.to_binary(piece)], acc}
        {:batch, _count, {:error, e}}, _acc -> raise e
        {:batch, _count, result}, acc -> {if(done?, do: [{:done, result}], else: []), acc}
      end)
    end
  end

  defmodule ExBurn.Serving.Pretrained.Rerank do
    @moduledoc false
    # ExBurn.Rerank.serving/2 (see ExBurn.Serving.Pretrained): one request per batch, passed to
    # the serving's task as a term, as the LLM serving does.
    @behaviour Nx.Serving

    alias ExBurn.Rerank
    import ExBurn.Serving.Pretrained.Util

    def build(%Rerank{} = model, opts) do
      opts = options!(opts, [:raw, :partitions])
      partitions = ExBurn.Tensor.Util.int_option!(:serving, opts, :partitions, 1)
      raw = Keyword.get(opts, :raw, false)
      unless is_boolean(raw), do: fail!(":raw must be a boolean", %{option: :raw, got: raw})

      Nx.Serving.new(__MODULE__, %{model: model, raw: raw}, partition_options(partitions))
      |> Nx.Serving.batch_size(1)
      |> Nx.Serving.process_options(partitions: partitions > 1)
      |> Nx.Serving.client_preprocessing(&preprocess/1)
      |> Nx.Serving.client_postprocessing(&postprocess/2)
    end

    def build(other, _opts), do: fail!("expected an ExBurn.Rerank model", %{got: other})

    @impl true
    def init(_type, arg, _partitions), do: {:ok, arg}

    @impl true
    def handle_batch(batch, _partition, state), do: {:execute, fn -> execute(state, batch) end, state}

    defp execute(%{model: model, raw: raw}, batch) do
      {query, documents} = batch |> materialize() |> Nx.to_binary() |> :erlang.binary_to_term([:safe])

      case Rerank.score(model, query, documents, raw: raw) do
        # the first axis is the batch's (one request), as Nx.Serving slices outputs
        {:ok, scores} -> {Nx.tensor([scores], type: :f32, backend: Nx.BinaryBackend), :ok}
        {:error, e} -> {Nx.tensor([[0.0]], type: :f32, backend: Nx.BinaryBackend), {:error, e}}
      end
    end

    defp preprocess({query, documents} = input) when is_binary(query) and is_list(documents) do
      unless documents != [] and Enum.all?(documents, &is_binary/1),
        do: fail!("documents must be a non-empty list of strings", %{got: documents, kind: :argument})

      payload = :erlang.term_to_binary(input)
      {Nx.Batch.stack([host_binary(payload, :u8, {byte_size(payload)})]), :single}
    end

    defp preprocess(other),
      do: fail!("the input must be {query, documents}", %{got: other, kind: :argument})

    defp postprocess({_scores, {:error, e}}, _info), do: raise(e)
    defp postprocess({scores, :ok}, _info), do: %{scores: Nx.squeeze(scores, axes: [0])}
  end
end
