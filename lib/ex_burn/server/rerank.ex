defmodule ExBurn.Server.Rerank do
  @moduledoc false
  # POST /v1/rerank, in the shape TEI, Jina and Cohere share:
  #
  #   {"model"?, "query": text, "documents": [text], "top_n"?, "return_documents"?}
  #   -> {"model", "results": [{"index", "relevance_score", "document"?}], "usage"}
  #
  # results sorted by score, highest first (ties in the documents' order), at most top_n;
  # "document" is {"text": ...} when return_documents is true.

  import ExBurn.Server.Handler, only: [json: 1, error: 3, json_body: 1]

  alias ExBurn.Server.{Inference, Response}

  def rerank(config, request, _params) do
    with {:ok, body} <- json_body(request),
         {:ok, query} <- query(body),
         {:ok, documents, _} <- Inference.texts(body, "documents", config),
         {:ok, top_n} <- top_n(body),
         {:ok, return?} <- return_documents(body),
         {:ok, served} <- Inference.model(config, body, :reranker, false),
         {:ok, scores, tokens} <- Inference.rerank(served, query, documents) do
      results =
        scores
        |> Enum.with_index()
        |> Enum.sort_by(fn {s, i} -> {-s, i} end)
        |> Enum.take(top_n || length(scores))
        |> Enum.map(fn {s, i} ->
          result = %{index: i, relevance_score: s}
          if return?, do: Map.put(result, :document, %{text: Enum.at(documents, i)}), else: result
        end)

      json(%{model: served.id, results: results, usage: %{prompt_tokens: tokens, total_tokens: tokens}})
    else
      {:error, %Response{} = response} -> response
    end
  end

  defp query(%{"query" => q}) when is_binary(q) and q != "", do: {:ok, q}

  defp query(%{"query" => _}),
    do: {:error, error(400, "\"query\" must be a non-empty string", param: "query")}

  defp query(_),
    do: {:error, error(400, "\"query\" is required", param: "query", code: "missing_required_parameter")}

  defp top_n(body) do
    case Map.get(body, "top_n") do
      nil -> {:ok, nil}
      n when is_integer(n) and n > 0 -> {:ok, n}
      _ -> {:error, error(400, "\"top_n\" must be a positive integer", param: "top_n")}
    end
  end

  defp return_documents(body) do
    case Map.get(body, "return_documents", false) do
      b when is_boolean(b) -> {:ok, b}
      _ -> {:error, error(400, "\"return_documents\" must be a boolean", param: "return_documents")}
    end
  end
end
