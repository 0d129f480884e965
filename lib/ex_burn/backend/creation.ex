if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.Creation do
    @moduledoc false

    import ExBurn.Backend.Util

    alias Nx.Tensor, as: T
    alias ExBurn.{Backend, Native}
    alias ExBurn.Tensor, as: ET
    alias ExBurn.Backend.Fallback

    def init(opts) do
      opts = Keyword.validate!(opts, [:device])
      if d = opts[:device], do: Keyword.put(opts, :device, ExBurn.Tensor.Util.device!(:init, d)), else: opts
    end

    def constant(%T{type: type, shape: shape} = out, number, opts) do
      if Backend.native_type?(type) and (is_number(number) or number in [:nan, :infinity, :neg_infinity]) do
        value = constant_value(number, type)

        if is_integer(value) and value > 0x7FFFFFFFFFFFFFFF do
          # Burn's fill takes a signed 64-bit scalar: the top half of u64 is uploaded as bytes.
          from_binary(out, :binary.copy(ET.encode!(:constant, value, type), Nx.size(shape)), opts)
        else
          Backend.put(out, wrap_native(Native.full(value, Tuple.to_list(shape), type, backend_device(opts))))
        end
      else
        Fallback.bump(:constant)
        from_binary(out, Nx.to_binary(Nx.BinaryBackend.constant(out, number, [])), opts)
      end
    end

    defp constant_value(number, {kind, _} = type) when is_number(number) and kind in [:s, :u] do
      # Nx wraps out-of-range integers into the type like a cast; so does the scalar encoder.
      <<x::native-size(elem(type, 1))-integer>> = ET.encode!(:constant, trunc(number), type)
      if kind == :s, do: signed(x, elem(type, 1)), else: x
    end

    defp constant_value(number, _type) when is_number(number), do: number * 1.0
    defp constant_value(atom, _type), do: atom

    defp signed(x, bits) do
      <<s::signed-size(bits)>> = <<x::size(bits)>>
      s
    end

    def from_binary(%T{type: type, shape: shape} = out, binary, opts) do
      device = backend_device(opts)

      if Backend.native_type?(type) do
        Backend.put(out, wrap_native(Native.from_binary(binary, Tuple.to_list(shape), type, device)))
      else
        host = if is_bitstring(binary), do: binary, else: IO.iodata_to_binary(binary)
        %{out | data: %Backend{host: host, shape: shape, device: device}}
      end
    end

    def eye(%T{type: type, shape: shape} = out, opts) do
      native :eye, out, [opts] do
        Backend.put(out, wrap_native(Native.eye(Tuple.to_list(shape), type, backend_device(opts))))
      end
    end

    def iota(%T{type: type, shape: shape} = out, axis, opts) do
      native :iota, out, [axis, opts] do
        Backend.put(out, wrap_native(Native.iota(Tuple.to_list(shape), type, axis, backend_device(opts))))
      end
    end
  end
end
