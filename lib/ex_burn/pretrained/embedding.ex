defmodule ExBurn.Embedding do
  @moduledoc """
  Sentence embeddings from pre-trained BERT-family models (sentence-transformers layout:
  `model.safetensors`, `config.json`, `tokenizer.json`, `1_Pooling/config.json`, `modules.json`).

      {:ok, model} = ExBurn.Embedding.load("all-minilm-l6-v2")
      {:ok, [v1, v2]} = ExBurn.Embedding.embed(model, ["A cat sits.", "Un chat est assis."])

  Texts are tokenised with the model's `tokenizer.json`, truncated at the model's maximum
  sequence length (`sentence_bert_config.json`), padded into one batch, pooled as
  `1_Pooling/config.json` says and normalised when `modules.json` has a `Normalize` module, as
  sentence-transformers does.

  Batch requests from many processes through `ExBurn.Serving.Batcher` (no Nx needed):

      {:ok, _} = ExBurn.Serving.Batcher.start_link(model, name: Embedder, batch_size: 32)
      {:ok, vector} = ExBurn.Serving.Batcher.run(Embedder, "some text")

  ## Options of `load/2`

    * `:engine` - `:auto` (default), `:burn` or `:candle` (see `ExBurn.Pretrained`)
    * `:device` - a device spec (`ExBurn.Device`); default `ExBurn.Device.default/0`
    * `:dir` - the models directory names are looked up in (`ExBurn.Models.dir/1`)
  """

  alias ExBurn.{Error, Pretrained}

  # Nx is optional: `as: :nx` checks for it at run time.
  @compile {:no_warn_undefined, Nx}

  defstruct [
    :ref,
    :name,
    :path,
    :engine,
    :device,
    :dim,
    :max_seq_len,
    :normalize,
    :pooling,
    :arch,
    auto: false
  ]

  @type t :: %__MODULE__{}

  @doc "Loads a model by name (in the models directory) or path. See the moduledoc for options."
  @spec load(String.t(), keyword) :: {:ok, t} | {:error, Error.t()}
  def load(name_or_path, opts \\ []) do
    Pretrained.load_struct(
      __MODULE__,
      :embedding,
      name_or_path,
      opts,
      &ExBurn.Native.embedder_load/2,
      &ExBurn.Native.embedder_info/1
    )
  end

  @doc "Like `load/2`, but raises `ExBurn.Error`."
  @spec load!(String.t(), keyword) :: t
  def load!(name_or_path, opts \\ []), do: bang(load(name_or_path, opts))

  @doc """
  Embeds `texts` (a list of strings, or one string) and returns one vector per text, in order
  (one vector for one string).

  `:as` picks the form: `:list` (default, lists of floats), `:tensor` (an `ExBurn.Tensor` of
  shape `{n, dim}`, f32) or `:nx` (an `Nx.Tensor` on `ExBurn.Backend`; needs Nx).
  """
  @spec embed(t, String.t() | [String.t()], keyword) :: {:ok, term} | {:error, Error.t()}
  def embed(model, texts, opts \\ [])

  def embed(model, _texts, _opts) when not is_struct(model, __MODULE__),
    do: Pretrained.not_a_model(:embed, __MODULE__, model)

  def embed(model, text, opts) when is_binary(text) do
    with {:ok, as} <- as_option(opts),
         {:ok, %{embeddings: bin}} <- run(model, [text]) do
      {:ok, convert(bin, {model.dim}, as)}
    end
  end

  def embed(%__MODULE__{} = model, texts, opts) do
    with {:ok, as} <- as_option(opts),
         {:ok, %{embeddings: bin, rows: n}} <- run(model, texts) do
      {:ok, convert(bin, {n, model.dim}, as)}
    end
  end

  @doc "Like `embed/3`, but raises `ExBurn.Error`."
  def embed!(model, texts, opts \\ []), do: bang(embed(model, texts, opts))

  @doc """
  Embeds `texts` and returns `%{embeddings: [[float]], token_ids: [[integer]], dim: dim}`: the
  token ids the model saw (special tokens included, after truncation), for inspection.
  """
  @spec encode(t, [String.t()]) :: {:ok, map} | {:error, Error.t()}
  def encode(model, _texts) when not is_struct(model, __MODULE__),
    do: Pretrained.not_a_model(:encode, __MODULE__, model)

  def encode(%__MODULE__{} = model, texts) do
    with {:ok, %{embeddings: bin, rows: n, token_ids: ids}} <- run(model, texts) do
      {:ok, %{embeddings: convert(bin, {n, model.dim}, :list), token_ids: ids, dim: model.dim}}
    end
  end

  @doc "The token ids of each text (special tokens included, truncated as `embed/3` does)."
  @spec tokenize(t, [String.t()]) :: {:ok, [[non_neg_integer]]} | {:error, Error.t()}
  def tokenize(model, _texts) when not is_struct(model, __MODULE__),
    do: Pretrained.not_a_model(:tokenize, __MODULE__, model)

  def tokenize(_model, texts) when not is_list(texts),
    do:
      Pretrained.error(:embedder_tokenize, "texts must be a list of strings", %{got: texts, kind: :argument})

  def tokenize(%__MODULE__{} = model, texts) do
    with {:ok, ids, _} <- call(model, :embedder_tokenize, &ExBurn.Native.embedder_tokenize(&1, texts)),
         do: {:ok, ids}
  end

  @doc """
  Embeds rows of token ids, as `tokenize/2` gives them (special tokens included, at most
  `max_seq_len` each): one vector per row, in order, equal to `embed/3` of the texts they came
  from. For callers that tokenise once on their own side, to count tokens or check lengths,
  and then embed without tokenising again. Takes `:as` as `embed/3` does.

  A row longer than `max_seq_len` (`details.kind` `:prompt_too_long`), an id outside the
  vocabulary (`:token_out_of_range`) or an empty row (`:empty_input`) is an `ExBurn.Error`:
  ids the model's tokenizer never gives are not truncated or clamped.
  """
  @spec embed_ids(t, [[non_neg_integer]], keyword) :: {:ok, term} | {:error, Error.t()}
  def embed_ids(model, rows, opts \\ [])

  def embed_ids(model, _rows, _opts) when not is_struct(model, __MODULE__),
    do: Pretrained.not_a_model(:embed_ids, __MODULE__, model)

  def embed_ids(_model, rows, _opts) when not is_list(rows),
    do:
      Pretrained.error(:embedder_embed_ids, "rows must be a list of lists of token ids", %{
        got: rows,
        kind: :argument
      })

  def embed_ids(%__MODULE__{} = model, rows, opts) do
    case call(model, :embedder_embed_ids, &ExBurn.Native.embedder_embed_ids(&1, rows)) do
      {:ok, {bin, _dim}, _model} ->
        {:ok, convert(bin, {length(rows), model.dim}, Keyword.get(opts, :as, :list))}

      {:error, _} = error ->
        error
    end
  end

  @doc "Like `embed_ids/3`, but raises `ExBurn.Error`."
  def embed_ids!(model, rows, opts \\ []), do: bang(embed_ids(model, rows, opts))

  @doc """
  Embeds a short text once at each batch size, so that the first requests don't pay for what a
  first call costs (on GPUs, compiling and tuning the kernels of each shape).

  Options: `:batch_sizes` - the sizes, in order (default `[1]`; the serving's `warmup: true`
  takes 1 and its `:batch_size`). Returns `{:ok, %{batch_sizes: sizes, ms: elapsed}}`.
  """
  @spec warm_up(t, keyword) :: {:ok, %{batch_sizes: [pos_integer], ms: non_neg_integer}} | {:error, Error.t()}
  def warm_up(model, opts \\ [])

  def warm_up(model, _opts) when not is_struct(model, __MODULE__),
    do: Pretrained.not_a_model(:embed_warm_up, __MODULE__, model)

  def warm_up(%__MODULE__{} = model, opts) do
    with :ok <- keyword_list(:embed_warm_up, opts),
         :ok <- Pretrained.known_options(:embed_warm_up, opts, [:batch_sizes]),
         {:ok, sizes} <-
           ExBurn.Pretrained.WarmUp.sizes(:embed_warm_up, Keyword.get(opts, :batch_sizes, [1]), [1]) do
      ExBurn.Pretrained.WarmUp.run(sizes, fn n ->
        with {:ok, _} <- run(model, List.duplicate("A short sentence to warm up with.", n)), do: :ok
      end)
    end
  end

  @doc """
  An `Nx.Serving` that embeds texts for many callers in shared batches (needs Nx):
  `Nx.Serving.run(serving, "text")` gives `%{embedding: tensor}`, a list of texts a list of
  them, as Bumblebee's `text_embedding`. Options `:batch_size` (32), `:batch_timeout` (10 ms),
  `:sequence_length`, `:partitions`; see `ExBurn.Serving.Pretrained`.
  """
  def serving(model, opts \\ []), do: ExBurn.Serving.Pretrained.embedding(model, opts)

  defp run(model, texts) when is_list(texts) do
    case call(model, :embedder_embed, &ExBurn.Native.embedder_embed(&1, texts)) do
      {:ok, {ids, bin, _dim}, _model} -> {:ok, %{embeddings: bin, rows: length(texts), token_ids: ids}}
      {:error, _} = error -> error
    end
  end

  defp run(_model, other),
    do:
      Pretrained.error(:embedder_embed, "texts must be a string or a list of strings", %{
        got: other,
        kind: :argument
      })

  defp call(model, op, fun) do
    Pretrained.call(Map.from_struct(model), op, &ExBurn.Native.embedder_load/2, fun)
  end

  @as [:list, :tensor, :nx]

  # embed/3's options, checked before any work: `:as` alone.
  defp as_option(opts) do
    with :ok <- keyword_list(:embed, opts),
         :ok <- Pretrained.known_options(:embed, opts, [:as]) do
      case Keyword.get(opts, :as, :list) do
        as when as in @as -> {:ok, as}
        as -> Pretrained.error(:embed, "unknown :as", %{as: as, allowed: @as, kind: :invalid_option})
      end
    end
  end

  defp keyword_list(op, opts) do
    if is_list(opts) and Keyword.keyword?(opts),
      do: :ok,
      else: Pretrained.error(op, "options must be a keyword list", %{got: opts, kind: :invalid_option})
  end

  defp convert(bin, {dim}, :list), do: floats(bin, dim) |> hd()
  defp convert(bin, {_n, dim}, :list), do: floats(bin, dim)
  defp convert(bin, shape, :tensor), do: ExBurn.Tensor.from_binary(bin, {:f, 32}, shape: shape)

  defp convert(bin, shape, :nx) do
    if Code.ensure_loaded?(Nx) do
      bin |> Nx.from_binary(:f32, backend: ExBurn.Backend) |> Nx.reshape(shape)
    else
      raise Error, op: :embed, reason: "as: :nx needs Nx", details: %{as: :nx}
    end
  end

  defp floats(bin, dim), do: for(<<x::float-32-native <- bin>>, do: x) |> Enum.chunk_every(dim)

  defp bang({:ok, value}), do: value
  defp bang({:error, e}), do: raise(e)
end
