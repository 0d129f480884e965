if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend do
    # The divergences are listed once, in guides/backend.md, and included here.
    @guide Path.expand("../../guides/backend.md", __DIR__)
    @external_resource @guide
    @divergences @guide
                 |> File.read!()
                 |> String.split("## Known divergences from Nx.BinaryBackend\n", parts: 2)
                 |> List.last()
                 |> String.split("\n## ", parts: 2)
                 |> hd()
                 |> String.trim()

    @moduledoc """
    An `Nx.Backend` on Burn: `Nx.default_backend(ExBurn.Backend)` (or
    `{ExBurn.Backend, device: {:vulkan, 0}}`) runs Nx on Burn tensors held by the ExBurn NIF.

    ## Options

      * `:device` - `:cpu` or `{kind, index}` (default `ExBurn.default_device/0`), per tensor.
        Operands on different devices are copied to the first operand's device (the native
        layer's rule, the same as for `ExBurn.Tensor`; see guides/devices.md).

    ## Native and fallback

    Element-wise ops, reductions, `dot`, shape ops, creation, `select`, `clip`, `slice` (dynamic
    starts too), `put_slice`, `reverse`, `pad` (interior padding too), `gather`, `indexed_add`/
    `indexed_put`, `sort`/`argsort`, `conv` (1 to 3 spatial axes, every option),
    `window_sum`/`window_max`/`window_min`/`window_product`, `window_scatter_max`/
    `window_scatter_min` and the cumulative and `take`/`take_along_axis`/`top_k` blocks run on
    Burn (see the guide for the exact list).
    Everything else runs through a counted fallback to `Nx.BinaryBackend` (host round trip):
    `ExBurn.Backend.Fallback.counts/0` reports how often each callback fell back. Types Burn
    cannot hold (complex, f8, 2/4-bit integers) are kept as host bytes and every op on them
    falls back.

    ## Divergences from `Nx.BinaryBackend`

    #{@divergences}
    """

    @behaviour Nx.Backend

    @enforce_keys [:device]
    defstruct [:ref, :shape, :device, :host]

    alias Nx.Tensor, as: T

    alias ExBurn.Backend.{
      Creation,
      Memory,
      Shape,
      Elementwise,
      Reduce,
      Block,
      Indexing,
      Pad,
      Window,
      Fallback
    }

    @doc "The `{kind, index}` device of a tensor held by this backend."
    def device(%T{data: %__MODULE__{device: device}}), do: device

    ## Callbacks, by op family

    # Each family's callbacks are the public functions it defines, so an op generated from a
    # table is named only in that table. The families share their helpers through
    # ExBurn.Backend.Util and never call this module, which only delegates to them.
    @families [Creation, Memory, Shape, Elementwise, Reduce, Block, Indexing, Pad, Window, Fallback]
    @callbacks Nx.Backend.behaviour_info(:callbacks)

    for family <- @families,
        {name, arity} = callback <- family.__info__(:functions),
        callback in @callbacks do
      args = Macro.generate_arguments(arity, __MODULE__)

      @impl true
      defdelegate unquote(name)(unquote_splicing(args)), to: family
    end
  end
end
