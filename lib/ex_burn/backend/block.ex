if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.Block do
    @moduledoc false
    # Blocks without a Burn kernel, or with operands Burn cannot hold, run their default
    # implementation (Nx's composition of other callbacks), not the counted fallback.

    import ExBurn.Backend.Util

    alias ExBurn.Native
    alias ExBurn.Tensor, as: ET

    @cumulative %{
      Nx.Block.CumulativeSum => :cumulative_sum,
      Nx.Block.CumulativeProduct => :cumulative_product,
      Nx.Block.CumulativeMin => :cumulative_min,
      Nx.Block.CumulativeMax => :cumulative_max
    }

    def block(%mod{} = struct, output, args, fun) do
      if native_block?(mod, output, args) do
        native_block(struct, output, args)
      else
        apply(fun, [struct | args])
      end
    end

    defp native_block?(mod, output, args) do
      (Map.has_key?(@cumulative, mod) or
         mod in [Nx.Block.Take, Nx.Block.TakeAlongAxis, Nx.Block.TopK, Nx.Block.LogicalNot]) and
        output |> List.wrap() |> Enum.flat_map(&flat_templates/1) |> Enum.all?(&native_type?(&1.type)) and
        native_args?(args)
    end

    defp flat_templates(tuple) when is_tuple(tuple), do: Tuple.to_list(tuple)
    defp flat_templates(t), do: [t]

    defp native_block(%mod{axis: axis, reverse: reverse}, out, [t]) when is_map_key(@cumulative, mod) do
      x = ET.as_type(et(t, nil), out.type)
      op = Map.fetch!(@cumulative, mod)
      put(out, wrap_native(Native.cumulative(op, x.ref, axis, reverse)))
    end

    defp native_block(%Nx.Block.Take{axis: axis}, out, [t, idx]) do
      d = device_of([t, idx])
      put(out, wrap_native(Native.take(ref(t, d), ref(idx, d), axis)))
    end

    defp native_block(%Nx.Block.TakeAlongAxis{axis: axis}, out, [t, idx]) do
      d = device_of([t, idx])
      put(out, wrap_native(Native.take_along_axis(ref(t, d), ref(idx, d), axis)))
    end

    defp native_block(%Nx.Block.TopK{k: k}, {values_out, idx_out}, [t]) do
      x = et(t, nil)
      axis = tuple_size(x.shape) - 1
      order = wrap_native(Native.argsort(x.ref, axis, true, {:s, 64}))
      dims = Tuple.to_list(x.shape)
      starts = Enum.map(dims, fn _ -> 0 end)
      top = ET.slice(order, starts, List.replace_at(dims, axis, k))
      values = wrap_native(Native.take_along_axis(x.ref, top.ref, axis))
      {put(values_out, values), put(idx_out, top)}
    end

    defp native_block(%Nx.Block.LogicalNot{}, out, [t]) do
      put(out, wrap_native(Native.unary(:logical_not, ref(t, nil), {:u, 8})))
    end
  end
end
