if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.Pad do
    @moduledoc false

    import ExBurn.Backend.Util

    alias ExBurn.{Backend, Native}
    alias ExBurn.Tensor, as: ET

    def pad(out, t, pad_value, config) do
      native :pad, out, [t, pad_value, config] do
        d = Backend.device_of([t, pad_value])
        x = ET.as_type(Backend.et(t, d), out.type)
        value = ET.as_type(Backend.et(pad_value, d), out.type)
        interior = Enum.map(config, &elem(&1, 2))

        # Interior padding first: negative edges then cut into the interior-padded tensor, as in
        # BinaryBackend.
        x =
          if Enum.all?(interior, &(&1 == 0)),
            do: x,
            else: wrap_native(Native.pad_interior(x.ref, value.ref, interior))

        Backend.put(out, edge_pad(x, value, config))
      end
    end

    # Positive edges are concatenated blocks of the pad value; negative ones are sliced off.
    defp edge_pad(x, value, config) do
      config
      |> Enum.with_index()
      |> Enum.reduce(x, fn {{lo, hi, _interior}, axis}, x ->
        x = grow(x, value, axis, max(lo, 0), :lo)
        x = grow(x, value, axis, max(hi, 0), :hi)
        shrink(x, axis, max(-lo, 0), max(-hi, 0))
      end)
    end

    defp grow(x, _value, _axis, 0, _side), do: x

    defp grow(x, value, axis, n, side) do
      shape = put_elem(x.shape, axis, n)
      block = wrap_native(Native.broadcast(value.ref, Tuple.to_list(shape), []))
      parts = if side == :lo, do: [block, x], else: [x, block]

      if ExBurn.Tensor.Util.size(x.shape) == 0 and elem(x.shape, axis) == 0,
        do: block,
        else: ET.concatenate(parts, axis: axis)
    end

    defp shrink(x, _axis, 0, 0), do: x

    defp shrink(x, axis, lo, hi) do
      dims = Tuple.to_list(x.shape)
      starts = dims |> Enum.map(fn _ -> 0 end) |> List.replace_at(axis, lo)
      lengths = List.replace_at(dims, axis, max(elem(x.shape, axis) - lo - hi, 0))
      ET.slice(x, starts, lengths)
    end
  end
end
