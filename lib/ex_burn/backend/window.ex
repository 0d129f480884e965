if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.Window do
    @moduledoc false

    import ExBurn.Backend.Util

    alias ExBurn.Backend.Fallback
    import ExBurn.Backend.Fallback, only: [native: 4]

    alias ExBurn.{Native, Type}

    def conv(out, t, k, opts) do
      spatial = tuple_size(t.shape) - 2

      # Burn has conv1d/2d/3d; more spatial axes take the fallback.
      if spatial in 1..3 do
        native :conv, out, [t, k, opts] do
          d = device_of([t, k])
          axes = Enum.to_list(0..(spatial + 1))

          spec =
            {opts[:strides], opts[:padding], opts[:input_dilation], opts[:kernel_dilation],
             opts[:feature_group_size], opts[:batch_group_size], opts[:input_permutation] || axes,
             opts[:kernel_permutation] || axes, opts[:output_permutation] || axes}

          put(out, wrap_native(Native.conv(ref(t, d), ref(k, d), spec, out.type)))
        end
      else
        Fallback.run(:conv, out, [t, k, opts])
      end
    end

    for op <- [:window_sum, :window_product, :window_max, :window_min] do
      def unquote(op)(out, t, window, opts) do
        native unquote(op), out, [t, window, opts] do
          ones = List.duplicate(1, tuple_size(t.shape))
          spec = {Tuple.to_list(window), opts[:strides], opts[:padding], opts[:window_dilations] || ones}
          put(out, wrap_native(Native.window_reduce(unquote(op), ref(t, nil), spec, out.type)))
        end
      end
    end

    for op <- [:window_scatter_max, :window_scatter_min] do
      def unquote(op)(out, t, source, init, window, opts) do
        if Enum.all?(opts[:padding], fn {lo, hi} -> lo >= 0 and hi >= 0 end) do
          native unquote(op), out, [t, source, init, window, opts] do
            d = device_of([t, source, init])
            spec = {Tuple.to_list(window), opts[:strides], opts[:padding]}

            answer =
              Native.window_scatter(
                unquote(op),
                ref(t, d),
                ref(source, d),
                ref(init, d),
                spec,
                scatter_select_type(t.type, init.type),
                out.type
              )

            put(out, wrap_native(answer))
          end
        else
          Fallback.run(unquote(op), out, [t, source, init, window, opts])
        end
      end
    end

    # BinaryBackend pads the tensor with the init value as a number and compares in the padded
    # tensor's type (Nx.Type.merge_number): float tensors keep their type, integer tensors with a
    # float init become f32. Integer widening does not change the order, so merge is enough.
    defp scatter_select_type(type, init_type) do
      cond do
        Type.float?(type) -> type
        Type.float?(init_type) -> {:f, 32}
        true -> Nx.Type.merge(type, init_type)
      end
    end
  end
end
