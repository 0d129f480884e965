if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.Creation do
    @moduledoc false

    import ExBurn.Backend.Util, except: [to_binary: 2, from_binary: 3]
    import ExBurn.Backend.Fallback, only: [native: 4]

    alias Nx.Tensor, as: T
    alias ExBurn.Native
    alias ExBurn.Backend.Util
    alias ExBurn.Backend.Fallback

    def init(opts) do
      opts = Keyword.validate!(opts, [:device])
      if d = opts[:device], do: Keyword.put(opts, :device, ExBurn.Tensor.Util.device!(:init, d)), else: opts
    end

    def constant(%T{type: type, shape: shape} = out, number, opts) do
      if native_type?(type) and (is_number(number) or number in [:nan, :infinity, :neg_infinity]) do
        value = ExBurn.Tensor.Util.fit(number, type)
        put(out, wrap_native(Native.full(value, Tuple.to_list(shape), type, backend_device(opts))))
      else
        Fallback.bump(:constant)
        from_binary(out, Nx.to_binary(Nx.BinaryBackend.constant(out, number, [])), opts)
      end
    end

    def from_binary(out, binary, opts), do: Util.from_binary(out, binary, backend_device(opts))

    def eye(%T{type: type, shape: shape} = out, opts) do
      native :eye, out, [opts] do
        put(out, wrap_native(Native.eye(Tuple.to_list(shape), type, backend_device(opts))))
      end
    end

    def iota(%T{type: type, shape: shape} = out, axis, opts) do
      native :iota, out, [axis, opts] do
        put(out, wrap_native(Native.iota(Tuple.to_list(shape), type, axis, backend_device(opts))))
      end
    end
  end
end
