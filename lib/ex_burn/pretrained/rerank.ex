defmodule ExBurn.Rerank do
  @moduledoc """
  Reranking with pre-trained cross-encoders (sentence-transformers `CrossEncoder` layout: a
  `BertForSequenceClassification`, `XLMRobertaForSequenceClassification` or
  `MPNetForSequenceClassification` checkpoint with one label, `config.json`, `model.safetensors`,
  `tokenizer.json`), such as ms-marco-MiniLM or bge-reranker.

      {:ok, model} = ExBurn.Rerank.load("ms-marco-minilm-l6-v2")
      {:ok, [s1, s2]} = ExBurn.Rerank.score(model, "what is a fox?", ["A fox is a canid.", "Paris"])

  The query and each document are read together (`[CLS] query [SEP] document [SEP]`, the longer
  one truncated first at the model's maximum length), and the score is the classification
  head's logit through the activation `CrossEncoder.predict` applies by default: the one saved
  with the model, else the sigmoid.

  ## Options of `load/2`

    * `:engine` - `:auto` (default), `:burn` or `:candle` (see `ExBurn.Pretrained`)
    * `:device` - a device spec (`ExBurn.Device`); default `ExBurn.Device.default/0`
    * `:dir` - the models directory names are looked up in (`ExBurn.Models.dir/1`, under
      `rerankers/`)
  """

  alias ExBurn.{Error, Pretrained}

  defstruct [:ref, :name, :path, :engine, :device, :max_seq_len, :activation, :arch, auto: false]

  @type t :: %__MODULE__{}

  @doc "Loads a cross-encoder by name (in the models directory) or path."
  @spec load(String.t(), keyword) :: {:ok, t} | {:error, Error.t()}
  def load(name_or_path, opts \\ []) do
    Pretrained.load_struct(
      __MODULE__,
      :reranker,
      name_or_path,
      opts,
      &ExBurn.Native.reranker_load/2,
      &ExBurn.Native.reranker_info/1
    )
  end

  @doc "Like `load/2`, but raises `ExBurn.Error`."
  @spec load!(String.t(), keyword) :: t
  def load!(name_or_path, opts \\ []), do: bang(load(name_or_path, opts))

  @doc """
  The score of each document (a list of strings) for `query`, in the documents' order.

  `raw: true` gives the logits, before the model's activation.
  """
  @spec score(t, String.t(), [String.t()], keyword) :: {:ok, [float]} | {:error, Error.t()}
  def score(model, query, documents, opts \\ []) do
    with {:ok, %{scores: scores}} <- run(model, query, documents, opts), do: {:ok, scores}
  end

  @doc "Like `score/4`, but raises `ExBurn.Error`."
  def score!(model, query, documents, opts \\ []), do: bang(score(model, query, documents, opts))

  @doc """
  Ranks `documents` for `query`: `%{index: i, score: s}` maps sorted by score, highest first
  (ties keep the documents' order). `:top_n` keeps only the first n; takes `:raw` as `score/4`.
  """
  @spec rank(t, String.t(), [String.t()], keyword) :: {:ok, [map]} | {:error, Error.t()}
  def rank(model, query, documents, opts \\ []) do
    with {:ok, top_n} <- top_n(Keyword.get(opts, :top_n)),
         {:ok, %{scores: scores}} <- run(model, query, documents, Keyword.delete(opts, :top_n)) do
      ranked =
        scores
        |> Enum.with_index()
        |> Enum.sort_by(fn {s, i} -> {-s, i} end)
        |> Enum.map(fn {s, i} -> %{index: i, score: s} end)

      {:ok, if(top_n, do: Enum.take(ranked, top_n), else: ranked)}
    end
  end

  @doc false
  # Scores and the token count of all (query, document) pairs: the server's usage.
  def run(model, _query, _documents, _opts) when not is_struct(model, __MODULE__),
    do: Pretrained.not_a_model(:rerank, __MODULE__, model)

  def run(model, query, documents, opts) do
    with :ok <- Pretrained.known_options(:rerank, opts, [:raw]),
         :ok <- texts(query, documents) do
      raw = Keyword.get(opts, :raw, false) == true

      case Pretrained.call(
             Map.from_struct(model),
             :reranker_score,
             &ExBurn.Native.reranker_load/2,
             &ExBurn.Native.reranker_score(&1, query, documents, raw)
           ) do
        {:ok, {scores, tokens}, _model} -> {:ok, %{scores: scores, tokens: tokens}}
        {:error, _} = error -> error
      end
    end
  end

  defp texts(query, documents) do
    cond do
      not is_binary(query) ->
        Pretrained.error(:rerank, "the query must be a string", %{got: query, kind: :argument})

      not is_list(documents) or not Enum.all?(documents, &is_binary/1) ->
        Pretrained.error(:rerank, "documents must be a list of strings", %{got: documents, kind: :argument})

      true ->
        :ok
    end
  end

  defp top_n(nil), do: {:ok, nil}
  defp top_n(n) when is_integer(n) and n > 0, do: {:ok, n}

  defp top_n(n),
    do: Pretrained.error(:rerank, ":top_n must be a positive integer", %{top_n: n, kind: :invalid_option})

  @doc """
  An `Nx.Serving` that scores documents for a query (needs Nx): `Nx.Serving.run(serving,
  {query, documents})` gives `%{scores: tensor}`. See `ExBurn.Serving.Pretrained.rerank/2`.
  """
  def serving(model, opts \\ []), do: ExBurn.Serving.Pretrained.rerank(model, opts)

  defp bang({:ok, value}), do: value
  defp bang({:error, e}), do: raise(e)
end
