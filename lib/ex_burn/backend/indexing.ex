if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.Indexing do
    @moduledoc false

    import ExBurn.Backend.Util

    alias ExBurn.{Backend, Native}
    alias ExBurn.Tensor, as: ET
    alias ExBurn.Backend.Shape

    def reverse(out, t, axes) do
      native :reverse, out, [t, axes] do
        Backend.put(out, wrap_native(Native.reverse(ET.as_type(Backend.et(t, nil), out.type).ref, axes)))
      end
    end

    def sort(out, t, opts) do
      native :sort, out, [t, opts] do
        x = ET.as_type(Backend.et(t, nil), out.type)
        Backend.put(out, wrap_native(Native.sort(x.ref, opts[:axis], opts[:direction] == :desc)))
      end
    end

    def argsort(out, t, opts) do
      native :argsort, out, [t, opts] do
        answer = Native.argsort(ref(t, nil), opts[:axis], opts[:direction] == :desc, out.type)
        Backend.put(out, wrap_native(answer))
      end
    end

    def put_slice(out, t, starts, slice) do
      native :put_slice, out, [t, starts, slice] do
        d = Backend.device_of([t, slice])
        starts = Shape.clamp_starts(starts, t.shape, Tuple.to_list(slice.shape))
        x = ET.as_type(Backend.et(t, d), out.type)
        Backend.put(out, wrap_native(Native.put_slice(x.ref, starts, ref(slice, d))))
      end
    end

    def gather(out, t, idx, opts) do
      native :gather, out, [t, idx, opts] do
        d = Backend.device_of([t, idx])
        axes = opts[:axes]
        {x, flat} = linearize(Backend.et(t, d), Backend.et(idx, d), axes)
        Backend.put(out, wrap_native(Native.take(x.ref, flat.ref, 0)))
      end
    end

    # Moves `axes` to the front and merges them into one axis; `idx` (last dimension: one
    # coordinate per axis) becomes indices into that merged axis. Coordinates out of range raise
    # like BinaryBackend.
    defp linearize(x, idx, axes) do
      rank = tuple_size(x.shape)
      perm = axes ++ (Enum.to_list(0..(rank - 1)) -- axes)
      x = if perm == Enum.to_list(0..(rank - 1)), do: x, else: ET.transpose(x, axes: perm)
      dims = Enum.map(axes, &elem(x.shape, Enum.find_index(perm, fn p -> p == &1 end)))
      rest = x.shape |> Tuple.to_list() |> Enum.drop(length(axes))
      x = ET.reshape(x, [Enum.product(dims) | rest])
      idx = ET.as_type(idx, {:s, 64})
      bounds = ET.tensor(dims, type: {:s, 64}, device: x.device)

      bad = ET.logical_or(ET.less(idx, 0), ET.greater_equal(idx, bounds)) |> ET.any()

      if ET.to_flat_list(bad) == [1], do: raise_out_of_bounds(idx, dims, x.shape)

      strides = dims |> Enum.reverse() |> Enum.scan(1, &(&1 * &2)) |> Enum.reverse() |> tl() |> Kernel.++([1])
      strides = ET.tensor(strides, type: {:s, 64}, device: x.device)
      last = tuple_size(idx.shape) - 1
      {x, ET.sum(ET.multiply(idx, strides), axes: [last])}
    end

    # BinaryBackend's message, naming the first offending coordinate (read only on this path).
    defp raise_out_of_bounds(idx, dims, shape) do
      k = length(dims)

      {i, axis} =
        idx
        |> ET.to_flat_list()
        |> Enum.chunk_every(k)
        |> Enum.find_value(fn row ->
          row
          |> Enum.zip(dims)
          |> Enum.with_index()
          |> Enum.find_value(fn {{i, d}, a} -> if i < 0 or i >= d, do: {i, a} end)
        end)

      shape = dims ++ (shape |> Tuple.to_list() |> Enum.drop(k))

      raise ArgumentError,
            "index #{i} is out of bounds for axis #{axis} in shape #{inspect(List.to_tuple(shape))}"
    end

    for {name, op} <- [indexed_add: :add, indexed_put: :put] do
      def unquote(name)(out, t, idx, updates, opts) do
        native unquote(name), out, [t, idx, updates, opts] do
          d = Backend.device_of([t, idx, updates])
          indexed(unquote(op), out, Backend.et(t, d), Backend.et(idx, d), Backend.et(updates, d), opts[:axes])
        end
      end
    end

    defp indexed(op, out, x, idx, updates, axes) do
      rank = tuple_size(x.shape)
      axes = axes || Enum.to_list(0..(elem(idx.shape, 1) - 1)//1)
      perm = axes ++ (Enum.to_list(0..(rank - 1)) -- axes)
      permuted_shape = Enum.map(perm, &elem(x.shape, &1))
      {x2, flat} = linearize(x, idx, axes)
      rows = elem(updates.shape, 0)
      upd = ET.reshape(updates, [rows | tl(Tuple.to_list(x2.shape))])
      r = wrap_native(Native.index_update(op, x2.ref, flat.ref, upd.ref, out.type))
      r = ET.reshape(r, permuted_shape)
      inverse = perm |> Enum.with_index() |> Enum.sort() |> Enum.map(&elem(&1, 1))
      Backend.put(out, if(perm == Enum.sort(perm), do: r, else: ET.transpose(r, axes: inverse)))
    end
  end
end
