if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.Reduce do
    @moduledoc false

    import ExBurn.Backend.Util
    import ExBurn.Backend.Fallback, only: [native: 4]

    alias ExBurn.Native

    for op <- [:sum, :product, :reduce_max, :reduce_min, :all, :any] do
      def unquote(op)(out, t, opts) do
        native unquote(op), out, [t, opts] do
          keep = opts[:keep_axes] == true
          put(out, wrap_native(Native.reduce(unquote(op), ref(t, nil), opts[:axes], keep, out.type)))
        end
      end
    end

    # Nx's NaN rule for argmax/argmin lives in the native op (ops::reduce::arg_reduce).
    for op <- [:argmax, :argmin] do
      def unquote(op)(out, t, opts) do
        native unquote(op), out, [t, opts] do
          keep = opts[:keep_axis] == true
          tie = opts[:tie_break] || :low
          answer = Native.arg_reduce(unquote(op), ref(t, nil), opts[:axis], keep, tie, out.type)
          put(out, wrap_native(answer))
        end
      end
    end

    def dot(out, l, contract_l, batch_l, r, contract_r, batch_r) do
      native :dot, out, [l, contract_l, batch_l, r, contract_r, batch_r] do
        d = device_of([l, r])

        precision = ExBurn.Precision.current()

        answer =
          Native.dot(ref(l, d), contract_l, batch_l, ref(r, d), contract_r, batch_r, out.type, precision)

        put(out, wrap_native(answer))
      end
    end
  end
end
