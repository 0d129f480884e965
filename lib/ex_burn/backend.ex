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
    alias ExBurn.Type
    alias ExBurn.Tensor, as: ET
    alias ExBurn.Backend.Fallback
    alias ExBurn.Backend.{Creation, Memory, Shape, Elementwise, Reduce, Block, Indexing, Pad, Window}

    @native_types Type.all()

    ## Conversion helpers

    @doc "The `{kind, index}` device of a tensor held by this backend."
    def device(%T{data: %__MODULE__{device: device}}), do: device

    @doc false
    def native_type?(type), do: type in @native_types

    # The ExBurn.Tensor behind an Nx tensor. Tensors of other backends are transferred in, onto
    # `device`; held tensors stay where they are, since the native op copies operands from other
    # devices to its first operand's device (one rule, in ops::colocate). Nx may reinterpret the
    # shape of our data (vectorize), so it is reshaped to the Nx shape when they differ.
    @doc false
    def et(%T{data: %__MODULE__{ref: ref, shape: shape, device: dev}} = t, _device)
        when is_reference(ref) do
      et = %ET{ref: ref, shape: shape, type: t.type, device: dev}
      if shape == t.shape, do: et, else: ET.reshape(et, t.shape)
    end

    def et(%T{} = t, device) do
      ET.from_binary(Nx.to_binary(t), t.type, shape: t.shape, device: device || ExBurn.default_device())
    end

    def et(number, device) when is_number(number),
      do: ExBurn.Tensor.Util.scalar(number, Type.infer(number), device || ExBurn.default_device())

    # Puts an ExBurn.Tensor into `out`, honouring out's type and shape exactly.
    @doc false
    def put(%T{type: type, shape: shape} = out, %ET{} = et) do
      et = if et.type == type, do: et, else: ET.as_type(et, type)
      et = if et.shape == shape, do: et, else: ET.reshape(et, shape)
      %{out | data: %__MODULE__{ref: et.ref, shape: et.shape, device: et.device}}
    end

    # The device results go to: the first operand held by this backend, else the default.
    @doc false
    def device_of(args) do
      found =
        Enum.find_value(List.wrap(args), fn
          %T{data: %__MODULE__{device: d}} -> d
          list when is_list(list) -> device_of_list(list)
          _ -> nil
        end)

      found || ExBurn.default_device()
    end

    defp device_of_list(list) do
      Enum.find_value(list, fn
        %T{data: %__MODULE__{device: d}} -> d
        _ -> nil
      end)
    end

    @merged_compute ExBurn.Tensor.Ops.binary_classes().predicate

    # The type a binary op computes in: comparisons and logical ops in their operands' merged
    # type (their result is {:u, 8}), every other op in Nx's result type. Backend and compiler.
    @doc false
    def compute_type(op, left, right, _out) when op in @merged_compute, do: Nx.Type.merge(left, right)
    def compute_type(_op, _left, _right, out), do: out

    # True when every tensor in `args` can be computed on Burn.
    @doc false
    def native_args?(args) do
      Enum.all?(List.wrap(args), fn
        %T{data: %__MODULE__{ref: nil}} -> false
        %T{type: type} -> native_type?(type)
        list when is_list(list) -> native_args?(list)
        _ -> true
      end)
    end

    @doc false
    def fallback(name, out, args) do
      out = if match?(%T{}, out), do: %{out | data: nil}, else: out
      Fallback.call(name, [out | args], device_of(args))
    end

    ## Callbacks, by op family

    # Each family's callbacks are the public functions it defines, so an op generated from a
    # table is named only in that table. Reading them makes this module compile after the
    # families: they call its helpers instead of importing them, or each would wait on the other.
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
