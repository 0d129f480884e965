defmodule ExBurn.Pretrained.EncodersTest do
  # The encoder families, pooling modules and cross-encoders through the Elixir API, on the tiny
  # random models test/data/gen_encoder_refs.py writes (committed, so nothing skips), against
  # its sentence-transformers references.
  use ExUnit.Case, async: true

  alias ExBurn.{Embedding, Rerank}

  @data Path.expand("../../data/encoders", __DIR__)
  @ref @data |> Path.join("reference.json") |> File.read!() |> ExBurn.JSON.decode!()

  defp cosine(a, b) do
    dot = Enum.zip_with(a, b, &(&1 * &2)) |> Enum.sum()
    dot / :math.sqrt(Enum.sum(Enum.map(a, &(&1 * &1))) * Enum.sum(Enum.map(b, &(&1 * &1))))
  end

  for {name, m} <- @ref["embeddings"], engine <- [:burn, :candle] do
    test "#{name} on #{engine}: token ids identical, cosine >= 0.9999 to sentence-transformers" do
      m = @ref["embeddings"][unquote(name)]
      model = Embedding.load!(Path.join(@data, m["path"]), engine: unquote(engine), device: :cpu)
      assert %Embedding{arch: arch, dim: dim, normalize: normalize, engine: unquote(engine)} = model
      assert {arch, dim, normalize} == {m["arch"], m["dim"], m["normalize"]}
      texts = Enum.map(m["cases"], & &1["text"])
      assert {:ok, %{embeddings: vectors, token_ids: ids}} = Embedding.encode(model, texts)

      for {c, v, i} <- Enum.zip([m["cases"], vectors, ids]) do
        assert i == c["token_ids"]
        assert length(v) == m["dim"]
        assert cosine(v, c["embedding"]) >= 0.9999
      end
    end
  end

  test "pooling modes and modules are reported" do
    assert %Embedding{pooling: [:last_token], normalize: true, dim: 16} =
             Embedding.load!(Path.join(@data, "tiny-bert-lasttoken-dense"), engine: :burn, device: :cpu)

    assert %Embedding{pooling: [:max, :weighted_mean], normalize: false, dim: 64} =
             Embedding.load!(Path.join(@data, "tiny-bert-max-weightedmean"), engine: :burn, device: :cpu)
  end

  test "MPNet loads on candle too; :auto runs it on burn" do
    path = Path.join(@data, "tiny-mpnet-mean")
    assert {:ok, %Embedding{engine: :candle, arch: "mpnet"}} = Embedding.load(path, engine: :candle)
    assert {:ok, %Embedding{engine: :burn, arch: "mpnet"}} = Embedding.load(path, device: :cpu)
  end

  test "an unsupported model_type is a typed error before the weights are read" do
    dir = Path.join(System.tmp_dir!(), "exburn_unknown_#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)
    src = Path.join(@data, "tiny-mpnet-mean")

    File.write!(
      Path.join(dir, "config.json"),
      src |> Path.join("config.json") |> File.read!() |> String.replace(~s("mpnet"), ~s("modernbert"))
    )

    File.cp!(Path.join(src, "tokenizer.json"), Path.join(dir, "tokenizer.json"))
    File.write!(Path.join(dir, "model.safetensors"), "not weights")

    for engine <- [:burn, :candle, :auto] do
      assert {:error, %ExBurn.Error{details: %{kind: :unknown_architecture, arch: "modernbert"}}} =
               Embedding.load(dir, engine: engine)

      assert {:error, %ExBurn.Error{details: %{kind: :unknown_architecture}}} =
               Rerank.load(dir, engine: engine)
    end
  end

  for {name, _} <- @ref["rerankers"], engine <- [:burn, :candle] do
    test "#{name} on #{engine}: scores within 1e-4 of CrossEncoder.predict" do
      m = @ref["rerankers"][unquote(name)]
      model = Rerank.load!(Path.join(@data, m["path"]), engine: unquote(engine), device: :cpu)
      assert %Rerank{activation: :sigmoid, arch: arch, max_seq_len: max} = model
      assert {arch, max} == {m["arch"], m["max_seq_length"]}
      assert {:ok, scores} = Rerank.score(model, m["query"], m["documents"])
      assert {:ok, logits} = Rerank.score(model, m["query"], m["documents"], raw: true)

      for {got, want} <- Enum.zip(scores ++ logits, m["scores"] ++ m["logits"]) do
        assert is_float(got)
        assert abs(got - want) < 1.0e-4
      end

      order =
        m["scores"] |> Enum.with_index() |> Enum.sort_by(fn {s, i} -> {-s, i} end) |> Enum.map(&elem(&1, 1))

      assert {:ok, ranked} = Rerank.rank(model, m["query"], m["documents"], top_n: 2)
      assert Enum.map(ranked, & &1.index) == Enum.take(order, 2)
    end
  end

  test "rerank input errors are typed" do
    model = Rerank.load!(Path.join(@data, "tiny-bert-reranker"), engine: :burn, device: :cpu)
    assert {:error, %ExBurn.Error{details: %{kind: :empty_input}}} = Rerank.score(model, "q", [])
    assert {:error, %ExBurn.Error{details: %{kind: :argument}}} = Rerank.score(model, "q", ["a", 1])
    assert {:error, %ExBurn.Error{details: %{kind: :argument}}} = Rerank.score(model, :q, ["a"])

    assert {:error, %ExBurn.Error{details: %{kind: :invalid_option}}} =
             Rerank.rank(model, "q", ["a"], top_n: 0)

    assert {:error, %ExBurn.Error{}} = Rerank.score(model, "q", ["a"], bogus: 1)
  end
end
