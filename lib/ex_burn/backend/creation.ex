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
        value = ExBurn.Tensor.Util.fit(number, type)
        Backend.put(out, wrap_native(Native.full(value, Tuple.to_list(shape), type, backend_device(opts))))
      else
        Fallback.bump(:constant)
        from_binary(out, Nx.to_binary(Nx.BinaryBackend.constant(out, number, [])), opts)
      end
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
