if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.Elementwise do
    @moduledoc false

    import ExBurn.Backend.Util

    alias ExBurn.Backend.Fallback
    import ExBurn.Backend.Fallback, only: [native: 4]

    alias ExBurn.Native
    alias ExBurn.Tensor, as: ET

    def select(out, pred, on_true, on_false) do
      native :select, out, [pred, on_true, on_false] do
        d = device_of([pred, on_true, on_false])
        answer = Native.select(ref(pred, d), ref(on_true, d), ref(on_false, d), out.type)
        put(out, wrap_native(answer))
      end
    end

    def clip(out, t, min, max) do
      native :clip, out, [t, min, max] do
        d = device_of([t, min, max])
        put(out, wrap_native(Native.clip(ref(t, d), ref(min, d), ref(max, d), out.type)))
      end
    end

    for op <- ExBurn.Tensor.Ops.binary_ops() do
      def unquote(op)(out, l, r) do
        native unquote(op), out, [l, r] do
          d = device_of([l, r])
          compute = compute_type(unquote(op), l.type, r.type, out.type)
          put(out, wrap_native(Native.binary(unquote(op), ref(l, d), ref(r, d), compute)))
        end
      end
    end

    @nx_unary Enum.map(Nx.Shared.unary_math_funs(), &elem(&1, 0)) ++
                [:abs, :bitwise_not, :ceil, :floor, :negate, :round, :sign] ++
                [:count_leading_zeros, :population_count, :is_nan, :is_infinity]

    for op <- @nx_unary do
      if op in ExBurn.Tensor.Ops.unary_ops() do
        def unquote(op)(out, t) do
          native unquote(op), out, [t] do
            put(out, wrap_native(Native.unary(unquote(op), ref(t, nil), out.type)))
          end
        end
      else
        def unquote(op)(out, t), do: Fallback.run(unquote(op), out, [t])
      end
    end

    # Real tensors: real/1 is a cast and imag/1 is zero; conjugate (complex output) and complex
    # inputs fall back.
    def real(out, t) do
      native :real, out, [t] do
        put(out, ET.as_type(et(t, nil), out.type))
      end
    end

    def imag(out, t) do
      native :imag, out, [t] do
        put(out, ET.zeros(out.shape, out.type, device: device_of([t])))
      end
    end

    def conjugate(out, t), do: Fallback.run(:conjugate, out, [t])
  end
end
