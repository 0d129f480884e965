defmodule ExBurn.Model.Store do
  @moduledoc false
  # The model file: "EXBURNMODEL" <> format version (8 bits)
  #   <> header length (64 bits) <> header (:erlang.term_to_binary of %{spec, config, seed, ...})
  #   <> weights length (64 bits) <> CRC-32 of the weights (32 bits) <> weights (Burn record bytes)

  alias ExBurn.{Error, Model, Native}

  @magic "EXBURNMODEL"
  @format 1

  def save(model, path) do
    save!(model, path)
  rescue
    e in Error -> {:error, e}
  end

  def save!(%Model{} = model, path) do
    path = path!(:save, path)
    weights = unwrap!(:save, Native.model_to_bytes(model.ref))

    header =
      :erlang.term_to_binary(%{
        spec: model.spec,
        config: model.config,
        seed: model.seed,
        epochs: model.epochs,
        library: Application.spec(:ex_burn, :vsn) |> to_string()
      })

    data = [
      @magic,
      <<@format::8, byte_size(header)::64>>,
      header,
      <<byte_size(weights)::64, :erlang.crc32(weights)::32>>,
      weights
    ]

    with {:error, reason} <- ExBurn.AtomicFile.write(path, data),
         do: fail!(:save, "cannot write the model file", %{path: path, cause: reason})
  end

  def save!(other, _path), do: fail!(:save, "expected an ExBurn.Model", %{got: other})

  def load(model_or_path, opts_or_path \\ []) do
    {:ok, load!(model_or_path, opts_or_path)}
  rescue
    e in Error -> {:error, e}
  end

  def load!(model_or_path, opts_or_path \\ [])

  def load!(%Model{} = model, path) do
    {header, weights} = read!(path)

    if header.spec != model.spec,
      do:
        fail!(:load, "the file holds a different architecture", %{
          path: path,
          expected: model.spec,
          got: header.spec
        })

    load_weights!(model, weights)
  end

  def load!(path, opts) when is_binary(path) do
    opts = ExBurn.Model.Options.keyword!(:load, opts, [:device])
    {header, weights} = read!(path)
    device = ExBurn.Tensor.Util.device!(:load, opts[:device])
    # read again as compile/2 would: a file written before a default existed gets it now
    config = Model.config!(:load, Map.to_list(header.config))
    model = Model.build!(:load, header.spec, config, device, header.seed)
    %{load_weights!(model, weights) | epochs: Map.get(header, :epochs, 0)}
  end

  def load!(other, _), do: fail!(:load, "expected a path or an ExBurn.Model", %{got: other})

  defp load_weights!(model, weights) do
    unwrap!(:load, Native.model_load_bytes(model.ref, weights))
    Model.refresh(model)
  end

  defp read!(path) do
    path = path!(:load, path)

    bin =
      case File.read(path) do
        {:ok, bin} -> bin
        {:error, reason} -> fail!(:load, "cannot read the model file", %{path: path, cause: reason})
      end

    corrupt = fn why -> fail!(:load, "corrupt or truncated model file: #{why}", %{path: path}) end

    case bin do
      <<@magic, @format::8, rest::binary>> ->
        with <<hlen::64, header::binary-size(hlen), rest::binary>> <- rest,
             <<wlen::64, crc::32, weights::binary-size(wlen)>> <- rest do
          if :erlang.crc32(weights) != crc, do: corrupt.("the weights checksum does not match")
          {decode_header!(header, corrupt), weights}
        else
          _ -> corrupt.("the sections do not have their recorded lengths")
        end

      <<@magic, format::8, _::binary>> ->
        fail!(:load, "unsupported model file format version #{format}", %{path: path})

      _ ->
        fail!(:load, "not an ExBurn model file", %{path: path})
    end
  end

  defp decode_header!(header, corrupt) do
    case :erlang.binary_to_term(header, [:safe]) do
      %{spec: %Model.Spec{}, config: config, seed: seed} = h when is_map(config) and is_integer(seed) -> h
      _ -> corrupt.("bad header")
    end
  rescue
    ArgumentError -> corrupt.("the header cannot be decoded")
  end

  defp path!(_op, path) when is_binary(path) and path != "", do: path
  defp path!(op, path), do: fail!(op, "expected a file path (a string)", %{path: path})

  defp unwrap!(op, {:error, {_, reason, details}}), do: fail!(op, reason, details)
  defp unwrap!(_op, answer), do: Error.unwrap!(answer)

  defp fail!(op, reason, details), do: raise(Error, op: op, reason: reason, details: details)
end
