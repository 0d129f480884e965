if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.Util do
    @moduledoc false
    # What the op families share: moving tensors between Nx and ExBurn.Tensor (`et`, `put`,
    # `to_binary`, `from_binary`), where results go, which types are native and the compute
    # type of binary ops. ExBurn.Backend only delegates to the families; nothing here calls it
    # or them.

    alias Nx.Tensor, as: T
    alias ExBurn.{Backend, Type}
    alias ExBurn.Tensor, as: ET

    @doc "The Burn tensor reference behind `t`, on `device`."
    def ref(t, device), do: et(t, device).ref

    def wrap_native(answer), do: ExBurn.Tensor.Util.wrap(answer)

    @doc "The device named by a callback's `:device` option."
    def backend_device(opts), do: ExBurn.Tensor.Util.device!(:backend, opts[:device])

    @native_types Type.all()

    @doc false
    def native_type?(type), do: type in @native_types

    # The ExBurn.Tensor behind an Nx tensor. Tensors of other backends are transferred in, onto
    # `device`; held tensors stay where they are, since the native op copies operands from other
    # devices to its first operand's device (one rule, in ops::colocate). Nx may reinterpret the
    # shape of our data (vectorize), so it is reshaped to the Nx shape when they differ.
    @doc false
    def et(%T{data: %Backend{ref: ref, shape: shape, device: dev}} = t, _device)
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
      %{out | data: %Backend{ref: et.ref, shape: et.shape, device: et.device}}
    end

    # The device results go to: the first operand held by this backend, else the default.
    @doc false
    def device_of(args) do
      found =
        Enum.find_value(List.wrap(args), fn
          %T{data: %Backend{device: d}} -> d
          list when is_list(list) -> device_of_list(list)
          _ -> nil
        end)

      found || ExBurn.default_device()
    end

    defp device_of_list(list) do
      Enum.find_value(list, fn
        %T{data: %Backend{device: d}} -> d
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
        %T{data: %Backend{ref: nil}} -> false
        %T{type: type} -> native_type?(type)
        list when is_list(list) -> native_args?(list)
        _ -> true
      end)
    end

    @doc "The bytes of a tensor this backend holds (native or host), at most `limit` elements."
    def to_binary(%T{data: %Backend{host: host}, type: {_, bits}}, limit) when is_bitstring(host) do
      case host do
        <<part::bitstring-size(limit * bits), _::bitstring>> when is_integer(limit) -> part
        _ -> host
      end
    end

    def to_binary(%T{data: %Backend{ref: ref}}, limit) do
      ExBurn.Error.unwrap!(ExBurn.Native.to_binary(ref, limit))
    end

    @doc "`out` holding `binary`: on Burn when its type is native, else as host bytes."
    def from_binary(%T{type: type, shape: shape} = out, binary, device) do
      if native_type?(type) do
        put(out, wrap_native(ExBurn.Native.from_binary(binary, Tuple.to_list(shape), type, device)))
      else
        host = if is_bitstring(binary), do: binary, else: IO.iodata_to_binary(binary)
        %{out | data: %Backend{host: host, shape: shape, device: device}}
      end
    end
  end
end
