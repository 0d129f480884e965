defmodule ExBurn.Model.StoreTest do
  use ExUnit.Case, async: true

  alias ExBurn.{Model, Tensor}
  import ExBurn.ModelTestData

  @moduletag :tmp_dir

  defp trained do
    {x, y} = xor()

    Model.input({nil, 2})
    |> Model.dense(8, activation: :tanh)
    |> Model.dropout(rate: 0.1)
    |> Model.dense(2)
    |> Model.compile(loss: :cross_entropy, learning_rate: 0.05)
    |> Model.fit({x, y}, epochs: 50, batch_size: 4)
  end

  defp bytes(model), do: Tensor.to_binary(Model.predict(model, elem(xor(), 0)))

  # Predictions of two model instances with the same weights: identical on the CPU; on CUDA the
  # dense layers run Burn's TF32 kernels, and the kernel autotuning picks may differ per
  # instance (a few 1e-4 apart), so there they agree to TF32 precision.
  defp assert_same_predictions(a, b) do
    if a.device == {:cpu, 0} do
      assert bytes(a) == bytes(b)
    else
      pa = Tensor.to_flat_list(Model.predict(a, elem(xor(), 0)))
      pb = Tensor.to_flat_list(Model.predict(b, elem(xor(), 0)))
      for {u, v} <- Enum.zip(pa, pb), do: assert(abs(u - v) <= 2.0e-3 * max(abs(u), 1.0), "#{u} vs #{v}")
    end
  end

  test "save -> load -> predict gives byte-identical outputs", %{tmp_dir: dir} do
    model = trained()
    path = Path.join(dir, "xor.model")
    assert Model.save(model, path) == :ok
    assert File.ls!(dir) == ["xor.model"], "no temporary file is left behind"

    assert {:ok, loaded} = Model.load(path)
    assert_same_predictions(loaded, model)
    # the weights themselves come back exactly, on every device
    assert Model.save(loaded, Path.join(dir, "again.model")) == :ok
    assert File.read!(Path.join(dir, "again.model")) == File.read!(path)
    File.rm!(Path.join(dir, "again.model"))

    assert {loaded.spec, loaded.config, loaded.seed, loaded.epochs} ==
             {model.spec, model.config, model.seed, 50}

    assert Model.summary(loaded) == Model.summary(model)

    # into a fresh compatible model (different initial weights)
    fresh = Model.compile(model.spec, loss: :cross_entropy, learning_rate: 0.05, seed: 99)
    assert bytes(fresh) != bytes(model)
    assert {:ok, into} = Model.load(fresh, path)
    assert_same_predictions(into, model)

    # a loaded model keeps training
    {x, y} = xor()
    assert %Model{epochs: 52} = Model.fit(loaded, {x, y}, epochs: 2, batch_size: 4)

    # overwrite in place
    assert Model.save(loaded, path) == :ok
    assert {:ok, again} = Model.load(path)
    assert_same_predictions(again, loaded)
  end

  test "corrupt, truncated, foreign and missing files are ExBurn.Error", %{tmp_dir: dir} do
    model = trained()
    before = bytes(model)
    path = Path.join(dir, "m.model")
    :ok = Model.save(model, path)
    good = File.read!(path)
    size = byte_size(good)

    flip = fn bin, at ->
      binary_part(bin, 0, at) <>
        <<Bitwise.bxor(:binary.at(bin, at), 0xFF)>> <> binary_part(bin, at + 1, byte_size(bin) - at - 1)
    end

    variants = [
      {"truncated", binary_part(good, 0, size - 10),
       "corrupt or truncated model file: the sections do not have their recorded lengths"},
      {"truncated header", binary_part(good, 0, 30),
       "corrupt or truncated model file: the sections do not have their recorded lengths"},
      {"weights byte flipped", flip.(good, size - 5),
       "corrupt or truncated model file: the weights checksum does not match"},
      {"header byte flipped", flip.(good, 25), nil},
      {"trailing junk", good <> "junk",
       "corrupt or truncated model file: the sections do not have their recorded lengths"},
      {"not a model", "hello world", "not an ExBurn model file"},
      {"empty", "", "not an ExBurn model file"},
      {"future format", "EXBURNMODEL" <> <<9>> <> binary_part(good, 12, size - 12),
       "unsupported model file format version 9"}
    ]

    for {label, content, reason} <- variants do
      bad = Path.join(dir, "bad.model")
      File.write!(bad, content)
      assert {:error, %ExBurn.Error{op: :load} = e} = Model.load(bad), label
      if reason, do: assert(e.reason == reason, "#{label}: #{e.reason}")
      assert {:error, %ExBurn.Error{op: :load}} = Model.load(model, bad), label
      assert_raise ExBurn.Error, fn -> Model.load!(bad) end
    end

    assert {:error,
            %ExBurn.Error{op: :load, reason: "cannot read the model file", details: %{cause: :enoent}}} =
             Model.load(Path.join(dir, "missing.model"))

    # the model that was loaded into is untouched by the failures
    assert bytes(model) == before
  end

  test "a file of another architecture is rejected", %{tmp_dir: dir} do
    model = trained()
    before = bytes(model)
    other = Model.input({nil, 2}) |> Model.dense(4) |> Model.dense(2) |> Model.compile(loss: :cross_entropy)
    path = Path.join(dir, "other.model")
    :ok = Model.save(other, path)

    assert {:error, %ExBurn.Error{op: :load, reason: "the file holds a different architecture"}} =
             Model.load(model, path)

    # a header that claims this architecture over another's weights: the native check rejects it
    {:ok, other_weights} = ExBurn.Native.model_to_bytes(other.ref)
    :ok = Model.save(model, path)
    bin = File.read!(path)
    <<"EXBURNMODEL", 1, hlen::64, header::binary-size(hlen), _::binary>> = bin

    forged = [
      "EXBURNMODEL",
      <<1, hlen::64>>,
      header,
      <<byte_size(other_weights)::64, :erlang.crc32(other_weights)::32>>,
      other_weights
    ]

    File.write!(path, forged)

    assert {:error, %ExBurn.Error{op: :load, reason: "cannot load the model weights", details: %{cause: _}}} =
             Model.load(path)

    assert {:error, %ExBurn.Error{op: :load, reason: "cannot load the model weights"}} =
             Model.load(model, path)

    assert bytes(model) == before
  end

  test "save errors", %{tmp_dir: dir} do
    model = trained()

    assert {:error, %ExBurn.Error{op: :save, reason: "cannot write the model file"}} =
             Model.save(model, Path.join([dir, "no", "such", "dir.model"]))

    assert {:error, %ExBurn.Error{op: :save}} = Model.save(model, :not_a_path)
    assert_raise ExBurn.Error, fn -> Model.save!(:not_a_model, Path.join(dir, "x.model")) end
    assert File.ls!(dir) == []
  end
end
