if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.Indexing do
    @moduledoc false

    import ExBurn.Backend.Util
    import ExBurn.Backend.Fallback, only: [native: 4]

    alias ExBurn.Native
    alias ExBurn.Backend.Shape

    def reverse(out, t, axes) do
      native :reverse, out, [t, axes] do
        put(out, wrap_native(Native.reverse(ref(t, nil), axes, out.type)))
      end
    end

    def sort(out, t, opts) do
      native :sort, out, [t, opts] do
        put(
          out,
          wrap_native(Native.sort(ref(t, nil), opts[:axis], opts[:direction] == :desc, out.type))
        )
      end
    end

    def argsort(out, t, opts) do
      native :argsort, out, [t, opts] do
        answer = Native.argsort(ref(t, nil), opts[:axis], opts[:direction] == :desc, out.type)
        put(out, wrap_native(answer))
      end
    end

    def put_slice(out, t, starts, slice) do
      native :put_slice, out, [t, starts, slice] do
        d = device_of([t, slice | starts])
        answer = Native.put_slice(ref(t, d), Shape.start_args(starts, d), ref(slice, d), out.type)
        put(out, wrap_native(answer))
      end
    end

    def gather(out, t, idx, opts) do
      native :gather, out, [t, idx, opts] do
        d = device_of([t, idx])
        put(out, wrap_native(Native.gather(ref(t, d), ref(idx, d), opts[:axes])))
      end
    end

    for {name, op} <- [indexed_add: :add, indexed_put: :put] do
      def unquote(name)(out, t, idx, updates, opts) do
        native unquote(name), out, [t, idx, updates, opts] do
          d = device_of([t, idx, updates])
          axes = opts[:axes] || Enum.to_list(0..(elem(idx.shape, tuple_size(idx.shape) - 1) - 1)//1)
          answer = Native.indexed(unquote(op), ref(t, d), ref(idx, d), ref(updates, d), axes, out.type)
          put(out, wrap_native(answer))
        end
      end
    end
  end
end
