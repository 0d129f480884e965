if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.Util do
    @moduledoc false
    # The op families' helpers that cannot live in `ExBurn.Backend`: it compiles after the
    # families, which import these. So nothing here may import or require `ExBurn.Backend`.

    alias ExBurn.Backend

    @doc "Runs `body` when the output type and all operands are native, else falls back."
    defmacro native(name, out, args, do: body) do
      quote do
        out = unquote(out)
        args = unquote(args)

        if Backend.native_type?(out.type) and Backend.native_args?(args) do
          unquote(body)
        else
          Backend.fallback(unquote(name), out, args)
        end
      end
    end

    @doc "The Burn tensor reference behind `t`, on `device`."
    def ref(t, device), do: Backend.et(t, device).ref

    def wrap_native(answer), do: ExBurn.Tensor.Util.wrap(answer)

    @doc "The device named by a callback's `:device` option."
    def backend_device(opts), do: ExBurn.Tensor.Util.device!(:backend, opts[:device])
  end
end
