defmodule ExBurn.LLM do
  @moduledoc """
  Text generation with pre-trained Llama-family models (GGUF architectures `llama`, `qwen2`,
  `qwen3`, `phi3`, `gemma`, `gemma2` and `gemma3`; config.json `model_type` `llama`, `mistral`,
  `qwen2`, `qwen3`, `phi3`, `gemma`, `gemma2` and `gemma3_text`)
  from GGUF files or Hugging Face directories (config.json, safetensors weights, tokenizer.json).

      {:ok, model} = ExBurn.LLM.load("smollm2-135m-instruct")
      {:ok, result} = ExBurn.LLM.generate(model, "The capital of France is", max_tokens: 16, greedy: true)
      result.text

      # Chat: the model's own template (GGUF `tokenizer.chat_template`, or a directory's
      # chat_template.jinja or tokenizer_config.json) renders the messages.
      ExBurn.LLM.stream(model, [%{role: "user", content: "Tell me a joke"}], max_tokens: 64)
      |> Enum.each(&IO.write/1)

  A prompt is a string (used as is, a plain completion) or a list of chat messages
  (`%{role: ..., content: ...}` maps or `{role, content}` tuples).

  ## Generation options

    * `:max_tokens` - the most tokens to generate (default 256)
    * `:greedy` - always take the most likely token (default false; same as `temperature: 0`)
    * `:temperature` - default 0.8, as llama.cpp; 0 means greedy
    * `:top_k` - default 40; `nil` turns it off
    * `:top_p` - default 0.95, at most 1; `nil` turns it off
    * `:seed` - the sampling seed; default a random one, so give it for repeatable samples
    * `:stop` - a string or strings that end generation (not included in the text)
    * `:stop_token_ids` - token ids that end generation, besides the model's end-of-sequence ids
    * `:ignore_eos` - when `true`, the model's end-of-sequence ids do not end generation, which
      runs to `:max_tokens` unless a stop string or `:stop_token_ids` ends it (as llama.cpp's and
      vLLM's `ignore_eos`; for benchmarks that need a fixed token count). Default `false`

  Any other option given as `nil` takes its default. An unknown option, or a value of the
  wrong kind, is an `ExBurn.Error` (`details.kind` `:invalid_option`, `details.option` naming
  it) before anything runs. These defaults are the only ones: the native side receives every
  option filled in.

  Generation also ends at the model's context length (`finish_reason: :length`).

  `load/2` takes the options of `ExBurn.Embedding.load/2` (`:engine`, `:device`, `:dir`).
  """

  alias ExBurn.{Error, Pretrained}

  defstruct [
    :ref,
    :name,
    :path,
    :engine,
    :device,
    :vocab_size,
    :context_length,
    :kv_bytes_per_token,
    :arch,
    :chat_template,
    :eos_token_ids,
    auto: false
  ]

  @type t :: %__MODULE__{}
  @type prompt :: String.t() | [%{role: String.t(), content: String.t()} | {String.t(), String.t()}]

  @defaults [
    max_tokens: 256,
    temperature: 0.8,
    top_k: 40,
    top_p: 0.95,
    stop: [],
    stop_token_ids: [],
    ignore_eos: false
  ]
  @options [:greedy, :seed | Keyword.keys(@defaults)]
  # nil turns these off rather than taking the default
  @nil_turns_off [:top_k, :top_p]

  @doc false
  # The generation options (for the servings that take them alongside their own).
  def generation_options, do: @options

  @doc """
  Loads a model by name (in the models directory) or path: a .gguf file, a directory holding one,
  or a Hugging Face directory.
  """
  @spec load(String.t(), keyword) :: {:ok, t} | {:error, Error.t()}
  def load(name_or_path, opts \\ []) do
    Pretrained.load_struct(
      __MODULE__,
      :llm,
      name_or_path,
      opts,
      &ExBurn.Native.llm_load/2,
      &ExBurn.Native.llm_info/1
    )
  end

  @doc "Like `load/2`, but raises `ExBurn.Error`."
  @spec load!(String.t(), keyword) :: t
  def load!(name_or_path, opts \\ []), do: bang(load(name_or_path, opts))

  @doc """
  Generates a completion of `prompt` and returns `{:ok, result}` with `:text`, `:prompt_ids`,
  `:generated_ids`, `:finish_reason` (`:stop` or `:length`) and `:usage`
  (`%{prompt_tokens: n, completion_tokens: m}`).
  """
  @spec generate(t, prompt, keyword) :: {:ok, map} | {:error, Error.t()}
  def generate(model, prompt, opts \\ [])

  def generate(model, _prompt, _opts) when not is_struct(model, __MODULE__),
    do: Pretrained.not_a_model(:generate, __MODULE__, model)

  def generate(%__MODULE__{} = model, prompt, opts) do
    with {:ok, start} <- start_args(prompt, opts) do
      call(model, :llm_generate, fn ref ->
        with {:ok, gen} <- ExBurn.Native.llm_start(ref, start.prompt, start.opts),
             {:ok, prompt_ids} <- ExBurn.Native.llm_prompt_ids(gen) do
          drain(gen, prompt_ids, [], [])
        end
      end)
    end
  end

  @doc "Like `generate/3`, but returns the result or raises `ExBurn.Error`."
  def generate!(model, prompt, opts \\ []), do: bang(generate(model, prompt, opts))

  @doc """
  A lazy `Stream` of text pieces; each is valid UTF-8 and together they are exactly
  `generate/3`'s text (same options, same seed). Generation runs as the stream is consumed, a
  token at a time, and stops when the consumer stops. Errors raise `ExBurn.Error` from the
  consuming process.
  """
  @spec stream(t, prompt, keyword) :: Enumerable.t()
  def stream(model, prompt, opts \\ [])

  def stream(model, _prompt, _opts) when not is_struct(model, __MODULE__),
    do: bang(Pretrained.not_a_model(:stream, __MODULE__, model))

  def stream(%__MODULE__{} = model, prompt, opts) do
    Stream.resource(
      fn -> start_stream!(model, prompt, opts) end,
      fn
        :done ->
          {:halt, :done}

        {:pending, gen, status, text} ->
          {pieces(text), after_step(gen, status)}

        gen ->
          gen
          |> ExBurn.Native.llm_next(1)
          |> step!()
          |> then(fn {status, text} -> {pieces(text), after_step(gen, status)} end)
      end,
      fn _ -> :ok end
    )
  end

  @doc """
  Like `stream/3`, but a stream of events: `{:text, piece}` for each piece of text and, last,
  `{:done, %{finish_reason: :stop | :length, usage: %{prompt_tokens: n, completion_tokens: m}}}`
  (what a server needs to report besides the text). Generation runs as the stream is consumed,
  as in `stream/3`.
  """
  @spec stream_events(t, prompt, keyword) :: Enumerable.t()
  def stream_events(model, prompt, opts \\ [])

  def stream_events(model, _prompt, _opts) when not is_struct(model, __MODULE__),
    do: bang(Pretrained.not_a_model(:stream_events, __MODULE__, model))

  def stream_events(%__MODULE__{} = model, prompt, opts) do
    Stream.resource(
      fn -> start_events!(model, prompt, opts) end,
      fn
        :done -> {:halt, :done}
        {:pending, gen, step, usage} -> events(gen, step, usage)
        {gen, usage} -> events(gen, event_step!(ExBurn.Native.llm_next(gen, 1)), usage)
      end,
      fn _ -> :ok end
    )
  end

  @doc """
  Runs the model once at each batch size, so that the first requests don't pay for what a
  first call costs (on GPUs, compiling and tuning the kernels of each batch size of a decoding
  step). For each size `n`, `n` generations of a one-word prompt run their prompt step, then
  one decoding step together, as `ExBurn.LLM.Scheduler` runs its batched steps.

  Options: `:batch_sizes` - the sizes, in order (default `[1]`). The scheduler's, the serving's
  and the HTTP server's `warmup: true` warms every size from 1 to their most generations in a
  step.

  Returns `{:ok, %{batch_sizes: sizes, ms: elapsed}}`.
  """
  @spec warm_up(t, keyword) :: {:ok, %{batch_sizes: [pos_integer], ms: non_neg_integer}} | {:error, Error.t()}
  def warm_up(model, opts \\ [])

  def warm_up(model, _opts) when not is_struct(model, __MODULE__),
    do: Pretrained.not_a_model(:llm_warm_up, __MODULE__, model)

  def warm_up(%__MODULE__{ref: ref}, opts) do
    with {:ok, opts} <- keyword(:llm_warm_up, opts),
         :ok <- Pretrained.known_options(:llm_warm_up, opts, [:batch_sizes]),
         {:ok, sizes} <-
           ExBurn.Pretrained.WarmUp.sizes(:llm_warm_up, Keyword.get(opts, :batch_sizes, [1]), [1]) do
      # ignore_eos: the decoding step must find every generation still running
      {:ok, start} = start_args("Hello", max_tokens: 2, greedy: true, ignore_eos: true)

      ExBurn.Pretrained.WarmUp.run(sizes, fn n ->
        with {:ok, gens} <- start_all(ref, start, n),
             {:ok, ids} <- Pretrained.wrap(ExBurn.Native.llm_prompt_ids(hd(gens))),
             :ok <- warm_step(gens, length(ids)),
             do: warm_step(gens, 1)
      end)
    end
  end

  defp start_all(ref, start, n) do
    Enum.reduce_while(1..n, {:ok, []}, fn _, {:ok, gens} ->
      case Pretrained.wrap(ExBurn.Native.llm_start(ref, start.prompt, start.opts)) do
        {:ok, gen} -> {:cont, {:ok, [gen | gens]}}
        error -> {:halt, error}
      end
    end)
  end

  # one batched step feeding `chunk` tokens to every generation; the first failure is the result
  defp warm_step(gens, chunk) do
    with {:ok, results} <- Pretrained.wrap(ExBurn.Native.llm_step(gens, List.duplicate(chunk, length(gens)))) do
      Enum.find_value(results, :ok, fn
        {:error, _} = error -> Pretrained.wrap(error)
        _ -> nil
      end)
    end
  end

  @doc """
  An `Nx.Serving` for generation (needs Nx): `Nx.Serving.run(serving, prompt)` gives
  `%{results: [%{text: ..., token_summary: ...}]}` as Bumblebee's `generation`, and with
  `stream: true` a stream of text pieces. Takes the generation options of `generate/3`; see
  `ExBurn.Serving.Pretrained`.
  """
  def serving(model, opts \\ []), do: ExBurn.Serving.Pretrained.llm(model, opts)

  @doc "The token ids of `text` (`add_special: true` adds the model's BOS token when it uses one)."
  @spec tokenize(t, String.t(), keyword) :: {:ok, [non_neg_integer]} | {:error, Error.t()}
  def tokenize(model, text, opts \\ [])

  def tokenize(model, _text, _opts) when not is_struct(model, __MODULE__),
    do: Pretrained.not_a_model(:tokenize, __MODULE__, model)

  def tokenize(%__MODULE__{ref: ref}, text, opts) do
    with {:ok, opts} <- keyword(:tokenize, opts),
         :ok <- Pretrained.known_options(:tokenize, opts, [:add_special]),
         do: Pretrained.wrap(ExBurn.Native.llm_tokenize(ref, text, Keyword.get(opts, :add_special, false)))
  end

  @doc "The text of token ids."
  @spec detokenize(t, [non_neg_integer]) :: {:ok, String.t()} | {:error, Error.t()}
  def detokenize(model, _ids) when not is_struct(model, __MODULE__),
    do: Pretrained.not_a_model(:detokenize, __MODULE__, model)

  def detokenize(%__MODULE__{ref: ref}, ids), do: Pretrained.wrap(ExBurn.Native.llm_detokenize(ref, ids))

  defp pieces(""), do: []
  defp pieces(text), do: [text]

  defp after_step(gen, :cont), do: gen
  defp after_step(_gen, :done), do: :done

  defp step!({:ok, {status, text, _ids, _finish}}), do: {status, text}
  defp step!(error), do: bang(Pretrained.wrap(error))

  # The first step runs here, inside `call3`, so an :auto model falls back to Candle (as in
  # generate/3) when Burn fails before any text has reached the consumer; later failures raise.
  defp start_stream!(model, prompt, opts) do
    start = bang(start_args(prompt, opts))

    {:ok, {gen, status, text}, _model} =
      call3(model, :llm_stream, fn ref ->
        with {:ok, gen} <- ExBurn.Native.llm_start(ref, start.prompt, start.opts),
             {:ok, {status, text, _ids, _finish}} <- ExBurn.Native.llm_next(gen, 1),
             do: {:ok, {gen, status, text}}
      end)
      |> ok!()

    {:pending, gen, status, text}
  end

  defp start_events!(model, prompt, opts) do
    start = bang(start_args(prompt, opts))

    {:ok, {gen, step, prompt_ids}, _model} =
      call3(model, :llm_stream, fn ref ->
        with {:ok, gen} <- ExBurn.Native.llm_start(ref, start.prompt, start.opts),
             {:ok, prompt_ids} <- ExBurn.Native.llm_prompt_ids(gen),
             {:ok, step} <- ExBurn.Native.llm_next(gen, 1),
             do: {:ok, {gen, step, prompt_ids}}
      end)
      |> ok!()

    {:pending, gen, step, %{prompt_tokens: length(prompt_ids), completion_tokens: 0}}
  end

  defp events(gen, {status, text, ids, finish}, usage) do
    usage = %{usage | completion_tokens: usage.completion_tokens + length(ids)}
    texts = for piece <- pieces(text), do: {:text, piece}

    case status do
      :cont -> {texts, {gen, usage}}
      :done -> {texts ++ [{:done, %{finish_reason: finish, usage: usage}}], :done}
    end
  end

  defp event_step!({:ok, step}), do: step
  defp event_step!(error), do: bang(Pretrained.wrap(error))

  defp drain(gen, prompt_ids, texts, ids) do
    case ExBurn.Native.llm_next(gen, 16) do
      {:ok, {:cont, text, new, _}} ->
        drain(gen, prompt_ids, [text | texts], [new | ids])

      {:ok, {:done, text, new, finish}} ->
        generated = [new | ids] |> Enum.reverse() |> Enum.concat()

        {:ok,
         %{
           text: [text | texts] |> Enum.reverse() |> IO.iodata_to_binary(),
           prompt_ids: prompt_ids,
           generated_ids: generated,
           finish_reason: finish,
           usage: %{prompt_tokens: length(prompt_ids), completion_tokens: length(generated)}
         }}

      {:error, _} = error ->
        error
    end
  end

  defp call(model, op, fun) do
    with {:ok, value, _model} <- call3(model, op, fun), do: {:ok, value}
  end

  defp call3(model, op, fun), do: Pretrained.call(Map.from_struct(model), op, &ExBurn.Native.llm_load/2, fun)

  @doc false
  # The NIF arguments for a prompt and options; every option is checked here so a typo is an
  # error rather than silently ignored.
  def start_args(prompt, opts) do
    with {:ok, prompt} <- prompt_arg(prompt),
         {:ok, opts} <- opts_arg(opts) do
      {:ok, %{prompt: prompt, opts: opts}}
    end
  end

  defp prompt_arg(text) when is_binary(text), do: {:ok, {:text, text}}

  defp prompt_arg([_ | _] = messages) do
    Enum.reduce_while(messages, {:ok, []}, fn message, {:ok, acc} ->
      case message(message) do
        {:ok, m} -> {:cont, {:ok, [m | acc]}}
        :error -> {:halt, invalid_prompt(message)}
      end
    end)
    |> case do
      {:ok, acc} -> {:ok, {:chat, Enum.reverse(acc)}}
      error -> error
    end
  end

  defp prompt_arg(other), do: invalid_prompt(other)

  defp message(%{role: role, content: content}), do: message({role, content})
  defp message(%{"role" => role, "content" => content}), do: message({role, content})

  defp message({role, content}) when is_atom(role) and not is_nil(role),
    do: message({Atom.to_string(role), content})

  defp message({role, content}) when is_binary(role) and is_binary(content), do: {:ok, {role, content}}
  defp message(_), do: :error

  defp invalid_prompt(got) do
    Pretrained.error(
      :llm_start,
      "a prompt is a string or a non-empty list of %{role: ..., content: ...} messages",
      %{
        got: got,
        kind: :invalid_prompt
      }
    )
  end

  # The NIF's `GenOptions`, every field filled in from `@defaults`.
  defp opts_arg(opts) do
    with {:ok, opts} <- keyword(:llm_start, opts),
         :ok <- Pretrained.known_options(:llm_start, opts, @options),
         given = Enum.reject(Keyword.new(opts), fn {key, v} -> v == nil and key not in @nil_turns_off end),
         opts = Keyword.merge(@defaults, given),
         :ok <- check_values(opts) do
      {:ok,
       %{
         max_tokens: opts[:max_tokens],
         temperature: if(opts[:greedy], do: 0.0, else: opts[:temperature] / 1),
         top_k: opts[:top_k],
         top_p: opts[:top_p] && opts[:top_p] / 1,
         seed: opts |> Keyword.get_lazy(:seed, fn -> :rand.uniform(4_294_967_295) end) |> u64(),
         stop: List.wrap(opts[:stop]),
         stop_token_ids: opts[:stop_token_ids],
         ignore_eos: opts[:ignore_eos]
       }}
    end
  end

  @expected [
    greedy: "a boolean",
    max_tokens: "a non-negative integer",
    temperature: "a number >= 0",
    top_k: "nil or a non-negative integer",
    top_p: "nil or a number from 0 to 1",
    seed: "an integer from -2^63 to 2^64 - 1",
    stop: "a string or a list of strings",
    stop_token_ids: "a list of token ids (integers from 0 to 2^32 - 1)",
    ignore_eos: "a boolean"
  ]

  defp check_values(opts) do
    case Enum.find(opts, fn {key, v} -> not valid?(key, v) end) do
      nil ->
        :ok

      {key, v} ->
        Pretrained.error(
          :llm_start,
          "invalid value for option #{inspect(key)}: expected #{@expected[key]}",
          %{
            option: key,
            value: v,
            kind: :invalid_option
          }
        )
    end
  end

  defp valid?(:greedy, v), do: is_boolean(v)
  defp valid?(:ignore_eos, v), do: is_boolean(v)
  defp valid?(:max_tokens, v), do: is_integer(v) and v >= 0
  defp valid?(:temperature, v), do: is_number(v) and v >= 0
  defp valid?(:top_k, v), do: v == nil or (is_integer(v) and v >= 0)
  defp valid?(:top_p, v), do: v == nil or (is_number(v) and v >= 0 and v <= 1)
  defp valid?(:seed, v), do: is_integer(v) and v >= -0x8000_0000_0000_0000 and v <= 0xFFFF_FFFF_FFFF_FFFF
  defp valid?(:stop, v), do: v |> List.wrap() |> Enum.all?(&is_binary/1)

  defp valid?(:stop_token_ids, v),
    do: is_list(v) and Enum.all?(v, &(is_integer(&1) and &1 >= 0 and &1 <= 0xFFFF_FFFF))

  # A negative seed (the server takes signed 64-bit ones) is its two's-complement u64.
  defp u64(seed) when seed < 0, do: seed + 0x1_0000_0000_0000_0000
  defp u64(seed), do: seed

  defp keyword(op, opts) do
    if is_list(opts) and Keyword.keyword?(opts),
      do: {:ok, opts},
      else: Pretrained.error(op, "options must be a keyword list", %{got: opts, kind: :invalid_option})
  end

  defp ok!({:ok, _, _} = ok), do: ok
  defp ok!({:error, e}), do: raise(e)

  defp bang({:ok, value}), do: value
  defp bang({:error, e}), do: raise(e)
end
