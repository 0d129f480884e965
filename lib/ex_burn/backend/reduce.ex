if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.Reduce do
    @moduledoc false

    import ExBurn.Backend.Util

    alias ExBurn.{Backend, Native, Type}
    alias ExBurn.Tensor, as: ET

    for op <- [:sum, :product, :reduce_max, :reduce_min, :all, :any] do
      def unquote(op)(out, t, opts) do
        native unquote(op), out, [t, opts] do
          keep = opts[:keep_axes] == true
          Backend.put(out, wrap_native(Native.reduce(unquote(op), ref(t, nil), opts[:axes], keep, out.type)))
        end
      end
    end

    for op <- [:argmax, :argmin] do
      def unquote(op)(out, t, opts) do
        native unquote(op), out, [t, opts] do
          Backend.put(out, arg_reduce(unquote(op), Backend.et(t, nil), opts, out.type))
        end
      end
    end

    # Nx ranks NaN above everything for both argmax and argmin, while Burn's comparisons are
    # false on NaN. BinaryBackend takes every NaN it meets, so a slice with NaNs yields the last
    # NaN's index whatever the tie break. A float tensor that holds a NaN (one read to find out)
    # takes that index where its slice has one.
    defp arg_reduce(op, x, opts, type) do
      keep = opts[:keep_axis] == true
      tie = opts[:tie_break] || :low
      axis = opts[:axis]
      plain = wrap_native(Native.arg_reduce(op, x.ref, axis, keep, tie, type))

      if Type.float?(x.type) and ET.any(ET.is_nan(x)) |> ET.to_flat_list() == [1] do
        nan = ET.is_nan(x)
        last_nan = wrap_native(Native.arg_reduce(:argmax, nan.ref, axis, keep, :high, type))
        axes = if axis, do: [axis], else: nil
        has_nan = wrap_native(Native.reduce(:any, nan.ref, axes, keep, {:u, 8}))
        ET.select(has_nan, last_nan, plain) |> ET.as_type(type)
      else
        plain
      end
    end

    def dot(out, l, contract_l, batch_l, r, contract_r, batch_r) do
      native :dot, out, [l, contract_l, batch_l, r, contract_r, batch_r] do
        d = Backend.device_of([l, r])

        precision = ExBurn.Precision.current()

        answer =
          Native.dot(ref(l, d), contract_l, batch_l, ref(r, d), contract_r, batch_r, out.type, precision)

        Backend.put(out, wrap_native(answer))
      end
    end
  end
end
