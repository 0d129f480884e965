if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.Shape do
    @moduledoc false

    import ExBurn.Backend.Util
    import ExBurn.Backend.Fallback, only: [native: 4]

    alias Nx.Tensor, as: T
    alias ExBurn.{Backend, Native}
    alias ExBurn.Tensor, as: ET
    alias ExBurn.Backend.Util

    def as_type(out, t) do
      native :as_type, out, [t] do
        put(out, ET.as_type(et(t, nil), out.type))
      end
    end

    def bitcast(%T{} = out, %T{} = t) do
      Util.from_binary(out, to_binary_any(t), device_of([t]))
    end

    defp to_binary_any(%T{data: %Backend{}} = t), do: Util.to_binary(t, nil)
    defp to_binary_any(t), do: Nx.to_binary(t)

    def reshape(out, t) do
      native :reshape, out, [t] do
        put(out, ET.reshape(et(t, nil), out.shape))
      end
    end

    def squeeze(out, t, axes) do
      native :squeeze, out, [t, axes] do
        _ = axes
        put(out, ET.reshape(et(t, nil), out.shape))
      end
    end

    def broadcast(out, t, shape, axes) do
      native :broadcast, out, [t, shape, axes] do
        put(out, wrap_native(Native.broadcast(ref(t, nil), Tuple.to_list(shape), axes, out.type)))
      end
    end

    def transpose(out, t, axes) do
      native :transpose, out, [t, axes] do
        put(out, wrap_native(Native.transpose(ref(t, nil), axes)))
      end
    end

    def slice(out, t, starts, lengths, strides) do
      native :slice, out, [t, starts, lengths, strides] do
        d = device_of([t | starts])
        put(out, wrap_native(Native.slice(ref(t, d), start_args(starts, d), lengths, strides)))
      end
    end

    @doc false
    # Slice starts for the NIF, which clamps them as Nx does: integers, or scalar tensors' refs.
    def start_args(starts, device), do: Enum.map(starts, &if(is_integer(&1), do: &1, else: ref(&1, device)))

    # Both take a list of tensors, moved to the first one's device.
    for op <- [:concatenate, :stack] do
      def unquote(op)(out, tensors, axis) do
        native unquote(op), out, [tensors, axis] do
          device = device_of(tensors)
          refs = Enum.map(tensors, &ref(&1, device))
          put(out, wrap_native(apply(Native, unquote(op), [refs, axis, out.type])))
        end
      end
    end
  end
end
