Code.require_file("support.exs", __DIR__)

defmodule ExBurn.Server.RerankHttpTest do
  # POST /v1/rerank over a real socket, with the tiny cross-encoder of test/data/encoders/ in a
  # models directory's rerankers/: the TEI/Jina/Cohere response shape, order, top_n,
  # return_documents, usage, and the errors.
  use ExUnit.Case, async: false

  alias ExBurn.ServerTest.Support

  @data Path.expand("../../data/encoders", __DIR__)
  @ref (@data
        |> Path.join("reference.json")
        |> File.read!()
        |> ExBurn.JSON.decode!())["rerankers"][
         "tiny-bert-reranker"
       ]

  setup do
    dir = Support.empty_dir()
    File.mkdir_p!(Path.join(dir, "rerankers"))
    File.cp_r!(Path.join(@data, "tiny-bert-reranker"), Path.join(dir, "rerankers/tiny-reranker"))
    File.mkdir_p!(Path.join(dir, "embeddings"))
    File.cp_r!(Path.join(@data, "tiny-mpnet-mean"), Path.join(dir, "embeddings/tiny-mpnet"))
    name = :"rerank_http_#{System.unique_integer([:positive])}"
    start_supervised!({ExBurn.Server, name: name, port: 0, models_dir: dir, token: nil, device: :cpu})
    %{url: ExBurn.Server.url(name) <> "/v1/rerank"}
  end

  test "scores, sorted, as CrossEncoder.predict", %{url: url} do
    docs = @ref["documents"]
    body = %{model: "tiny-reranker", query: @ref["query"], documents: docs}
    assert {200, headers, resp} = Support.http_json(:post, url, body: body)
    assert headers["content-type"] == "application/json"
    assert %{"model" => "tiny-reranker", "results" => results, "usage" => usage} = resp
    assert length(results) == length(docs)
    assert usage["total_tokens"] == @ref["token_ids"] |> Enum.map(&length/1) |> Enum.sum()

    scores = Enum.map(results, & &1["relevance_score"])
    assert scores == Enum.sort(scores, :desc)

    for %{"index" => i, "relevance_score" => s} = r <- results do
      assert abs(s - Enum.at(@ref["scores"], i)) < 1.0e-4
      refute Map.has_key?(r, "document")
    end

    assert Enum.sort(Enum.map(results, & &1["index"])) == Enum.to_list(0..(length(docs) - 1))

    # top_n and return_documents; the model is the only reranker, so it may go unnamed
    body = %{query: @ref["query"], documents: docs, top_n: 2, return_documents: true}
    assert {200, _, %{"results" => [first, second]}} = Support.http_json(:post, url, body: body)
    assert [first["index"], second["index"]] == Enum.map(Enum.take(results, 2), & &1["index"])
    assert first["document"] == %{"text" => Enum.at(docs, first["index"])}
  end

  test "request errors", %{url: url} do
    q = @ref["query"]

    assert {400, _, %{"error" => %{"param" => "query"}}} =
             Support.http_json(:post, url, body: %{model: "tiny-reranker", documents: ["a"]})

    assert {400, _, %{"error" => %{"param" => "documents"}}} =
             Support.http_json(:post, url, body: %{model: "tiny-reranker", query: q, documents: []})

    assert {400, _, %{"error" => %{"param" => "top_n"}}} =
             Support.http_json(:post, url,
               body: %{model: "tiny-reranker", query: q, documents: ["a"], top_n: 0}
             )

    assert {400, _, %{"error" => %{"code" => "wrong_model_kind"}}} =
             Support.http_json(:post, url, body: %{model: "tiny-mpnet", query: q, documents: ["a"]})

    assert {404, _, %{"error" => %{"code" => "model_not_found"}}} =
             Support.http_json(:post, url, body: %{model: "nope", query: q, documents: ["a"]})
  end
end
