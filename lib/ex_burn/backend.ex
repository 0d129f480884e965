if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend do
    @moduledoc """
    An `Nx.Backend` on Burn: `Nx.default_backend(ExBurn.Backend)` (or
    `{ExBurn.Backend, device: {:vulkan, 0}}`) runs Nx on Burn tensors held by the ExBurn NIF.

    ## Options

      * `:device` - `:cpu` or `{kind, index}` (default `ExBurn.default_device/0`), per tensor.
        Operands on different devices are moved to the first operand's device.

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

      1. Float results come from Burn's kernels (`flex` on the CPU): transcendental functions may
         differ from Erlang's `:math` in the last bits, and sums are accumulated in a different
         order, so compare floats with a tolerance.
      2. `Nx.as_type/2` from floats to integers truncates in Burn: NaN and infinities do not
         saturate the way BinaryBackend's conversion does (NaN gives 0 there; here it is
         whatever the device's conversion gives).
      3. Integer arithmetic wraps in the operand width like BinaryBackend, but integer division
         or remainder by zero raises `ExBurn.Error` (BinaryBackend raises `ArithmeticError`).
      4. Fallback ops (above) run on the host: they are correct but slow, and move data off
         GPU devices.
      5. `Nx.Backend.inspect/3` output is identical to BinaryBackend's (the device is not
         printed); use `ExBurn.Backend.device/1` to read it.
      6. `conv` accumulates f32/f16/bf16 results in f32 (BinaryBackend: f64), and converts
         integer operands to the float output type first (integers above 2^24 are rounded
         before they are multiplied). Float `window_sum`/`window_product` accumulate in f64
         axis by axis, so their last bit can differ.
    """

    @behaviour Nx.Backend

    @enforce_keys [:device]
    defstruct [:ref, :shape, :device, :host]

    alias Nx.Tensor, as: T
    alias ExBurn.{Native, Type}
    alias ExBurn.Tensor, as: ET
    alias ExBurn.Backend.Fallback

    @native_types Type.all()

    ## Conversion helpers

    @doc "The `{kind, index}` device of a tensor held by this backend."
    def device(%T{data: %__MODULE__{device: device}}), do: device

    @doc false
    def native_type?(type), do: type in @native_types

    # The ExBurn.Tensor behind an Nx tensor, on `device`. Tensors of other backends are
    # transferred in; Nx may reinterpret the shape of our data (vectorize), so it is reshaped to
    # the Nx shape when they differ.
    @doc false
    def et(%T{data: %__MODULE__{ref: ref, shape: shape, device: dev}} = t, device)
        when is_reference(ref) do
      et = %ET{ref: ref, shape: shape, type: t.type, device: dev}
      et = if shape == t.shape, do: et, else: ET.reshape(et, t.shape)
      if device == nil or device == dev, do: et, else: ET.to_device(et, device)
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

    defp ref(t, device), do: et(t, device).ref

    defp wrap_native(answer), do: ExBurn.Tensor.Util.wrap(answer)

    # The device results go to: the first operand held by this backend, else the default.
    defp device_of(args) do
      Enum.find_value(List.wrap(args), ExBurn.default_device(), fn
        %T{data: %__MODULE__{device: d}} -> d
        list when is_list(list) -> device_of_list(list)
        _ -> nil
      end)
    end

    defp device_of_list(list) do
      Enum.find_value(list, fn
        %T{data: %__MODULE__{device: d}} -> d
        _ -> nil
      end)
    end

    # True when every tensor in `args` can be computed on Burn.
    defp native_args?(args) do
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

    # Runs `fun` when the output type and all operands are native, else falls back.
    defmacrop native(name, out, args, do: body) do
      quote do
        out = unquote(out)
        args = unquote(args)

        if native_type?(out.type) and native_args?(args) do
          unquote(body)
        else
          fallback(unquote(name), out, args)
        end
      end
    end

    defp backend_device(opts) do
      ExBurn.Tensor.Util.device!(:backend, opts[:device])
    end

    ## Creation

    @impl true
    def init(opts) do
      opts = Keyword.validate!(opts, [:device])
      if d = opts[:device], do: Keyword.put(opts, :device, ExBurn.Tensor.Util.device!(:init, d)), else: opts
    end

    @impl true
    def constant(%T{type: type, shape: shape} = out, number, opts) do
      if native_type?(type) and (is_number(number) or number in [:nan, :infinity, :neg_infinity]) do
        value = constant_value(number, type)

        if is_integer(value) and value > 0x7FFFFFFFFFFFFFFF do
          # Burn's fill takes a signed 64-bit scalar: the top half of u64 is uploaded as bytes.
          from_binary(out, :binary.copy(ET.encode!(:constant, value, type), Nx.size(shape)), opts)
        else
          put(out, wrap_native(Native.full(value, Tuple.to_list(shape), type, backend_device(opts))))
        end
      else
        Fallback.bump(:constant)
        from_binary(out, Nx.to_binary(Nx.BinaryBackend.constant(out, number, [])), opts)
      end
    end

    defp constant_value(number, {kind, _} = type) when is_number(number) and kind in [:s, :u] do
      # Nx wraps out-of-range integers into the type like a cast; so does the scalar encoder.
      <<x::native-size(elem(type, 1))-integer>> = ET.encode!(:constant, trunc(number), type)
      if kind == :s, do: signed(x, elem(type, 1)), else: x
    end

    defp constant_value(number, _type) when is_number(number), do: number * 1.0
    defp constant_value(atom, _type), do: atom

    defp signed(x, bits) do
      <<s::signed-size(bits)>> = <<x::size(bits)>>
      s
    end

    @impl true
    def from_binary(%T{type: type, shape: shape} = out, binary, opts) do
      device = backend_device(opts)

      if native_type?(type) do
        put(out, wrap_native(Native.from_binary(binary, Tuple.to_list(shape), type, device)))
      else
        host = if is_bitstring(binary), do: binary, else: IO.iodata_to_binary(binary)
        %{out | data: %__MODULE__{host: host, shape: shape, device: device}}
      end
    end

    @impl true
    def eye(%T{type: type, shape: shape} = out, opts) do
      native :eye, out, [opts] do
        put(out, wrap_native(Native.eye(Tuple.to_list(shape), type, backend_device(opts))))
      end
    end

    @impl true
    def iota(%T{type: type, shape: shape} = out, axis, opts) do
      native :iota, out, [axis, opts] do
        put(out, wrap_native(Native.iota(Tuple.to_list(shape), type, axis, backend_device(opts))))
      end
    end

    ## Memory, transfer, inspection

    @impl true
    def to_binary(%T{data: %__MODULE__{host: host}, type: {_, bits}}, limit) when is_bitstring(host) do
      case host do
        <<part::bitstring-size(limit * bits), _::bitstring>> when is_integer(limit) -> part
        _ -> host
      end
    end

    def to_binary(%T{data: %__MODULE__{ref: ref}}, limit) do
      ExBurn.Error.unwrap!(Native.to_binary(ref, limit))
    end

    @impl true
    def backend_deallocate(%T{data: %__MODULE__{ref: ref}}) when is_reference(ref),
      do: ExBurn.Error.unwrap!(Native.deallocate(ref))

    def backend_deallocate(_), do: :ok

    @impl true
    def backend_copy(%T{} = t, __MODULE__, opts) do
      device = backend_device(opts)

      case t.data do
        %__MODULE__{ref: nil} -> %{t | data: %{t.data | device: device}}
        _ -> put(t, et(t, device))
      end
    end

    def backend_copy(%T{} = t, backend, opts), do: backend.from_binary(t, to_binary(t, nil), opts)

    @impl true
    def backend_transfer(%T{data: %__MODULE__{device: device}} = t, __MODULE__, opts) do
      if backend_device(opts) == device, do: t, else: transfer_and_free(t, __MODULE__, opts)
    end

    def backend_transfer(t, backend, opts), do: transfer_and_free(t, backend, opts)

    defp transfer_and_free(t, backend, opts) do
      copy = backend_copy(t, backend, opts)
      backend_deallocate(t)
      copy
    end

    @impl true
    def inspect(%T{} = t, inspect_opts) do
      limit = if inspect_opts.limit == :infinity, do: nil, else: min(inspect_opts.limit + 1, Nx.size(t))
      Nx.Backend.inspect(t, to_binary(t, limit), inspect_opts)
    end

    @impl true
    def to_batched(%T{shape: batch_shape} = out, %T{shape: shape} = t, opts) do
      batch = elem(batch_shape, 0)
      total = elem(shape, 0)
      full = div(total, batch)
      rest = rem(total, batch)
      ranges = for i <- 0..(full - 1)//1, do: {i * batch, batch}

      if native_type?(t.type) and native_args?([t]) do
        x = et(t, nil)
        tail_dims = tl(Tuple.to_list(shape))
        zeros = Enum.map(tail_dims, fn _ -> 0 end)
        take = fn start, len -> ET.slice(x, [start | zeros], [len | tail_dims]) end

        # Lazy, like BinaryBackend: batches are sliced as the stream is consumed.
        leftover =
          if rest != 0 and opts[:leftover] == :repeat,
            do: [:wrap],
            else: []

        Stream.map(ranges ++ leftover, fn
          {s, l} -> put(out, take.(s, l))
          :wrap -> put(out, ET.concatenate([take.(full * batch, rest), take.(0, batch - rest)]))
        end)
      else
        Fallback.bump(:to_batched)
        host = Fallback.to_host(t)
        device = device_of([t])

        Nx.BinaryBackend.to_batched(out, host, opts)
        |> Stream.map(&Fallback.from_host(&1, device))
      end
    end

    @impl true
    def from_pointer(_, _, _, _, _),
      do: raise(ArgumentError, "#{inspect(__MODULE__)} does not support pointer manipulation")

    @impl true
    def to_pointer(_, _),
      do: raise(ArgumentError, "#{inspect(__MODULE__)} does not support pointer manipulation")

    ## Types and shapes

    @impl true
    def as_type(out, t) do
      native :as_type, out, [t] do
        put(out, ET.as_type(et(t, nil), out.type))
      end
    end

    @impl true
    def bitcast(%T{} = out, %T{} = t) do
      from_binary(out, to_binary_any(t), device: device_of([t]))
    end

    defp to_binary_any(%T{data: %__MODULE__{}} = t), do: to_binary(t, nil)
    defp to_binary_any(t), do: Nx.to_binary(t)

    @impl true
    def reshape(out, t) do
      native :reshape, out, [t] do
        put(out, ET.reshape(et(t, nil), out.shape))
      end
    end

    @impl true
    def squeeze(out, t, axes) do
      native :squeeze, out, [t, axes] do
        _ = axes
        put(out, ET.reshape(et(t, nil), out.shape))
      end
    end

    @impl true
    def broadcast(out, t, shape, axes) do
      native :broadcast, out, [t, shape, axes] do
        x = et(t, nil)
        x = if x.type == out.type, do: x, else: ET.as_type(x, out.type)
        put(out, wrap_native(Native.broadcast(x.ref, Tuple.to_list(shape), axes)))
      end
    end

    @impl true
    def transpose(out, t, axes) do
      native :transpose, out, [t, axes] do
        put(out, wrap_native(Native.transpose(ref(t, nil), axes)))
      end
    end

    @impl true
    def slice(out, t, starts, lengths, strides) do
      native :slice, out, [t, starts, lengths, strides] do
        starts = clamp_starts(starts, t.shape, lengths)
        put(out, wrap_native(Native.slice(ref(t, nil), starts, lengths, strides)))
      end
    end

    # Nx clamps start indices (numbers or scalar tensors) so the window fits.
    defp clamp_starts(starts, shape, lengths) do
      [starts, Tuple.to_list(shape), lengths]
      |> Enum.zip()
      |> Enum.map(fn {s, dim, len} -> s |> to_int() |> max(0) |> min(dim - len) end)
    end

    defp to_int(n) when is_integer(n), do: n
    defp to_int(%T{} = t), do: Nx.to_number(t)

    @impl true
    def concatenate(out, tensors, axis) do
      native :concatenate, out, [tensors, axis] do
        device = device_of(tensors)
        refs = Enum.map(tensors, &ref(&1, device))
        put(out, wrap_native(Native.concatenate(refs, axis, out.type)))
      end
    end

    @impl true
    def stack(out, tensors, axis) do
      native :stack, out, [tensors, axis] do
        device = device_of(tensors)
        refs = Enum.map(tensors, &ref(&1, device))
        put(out, wrap_native(Native.stack(refs, axis, out.type)))
      end
    end

    ## Element-wise

    @impl true
    def select(out, pred, on_true, on_false) do
      native :select, out, [pred, on_true, on_false] do
        d = device_of([pred, on_true, on_false])
        put(out, wrap_native(Native.select(ref(pred, d), ref(on_true, d), ref(on_false, d), out.type)))
      end
    end

    @impl true
    def clip(out, t, min, max) do
      native :clip, out, [t, min, max] do
        d = device_of([t, min, max])
        [x, lo, hi] = Enum.map([t, min, max], &ET.as_type(et(&1, d), out.type))
        put(out, wrap_native(Native.clip(x.ref, lo.ref, hi.ref)))
      end
    end

    # Comparisons and logical ops compute in the operands' merged type; everything else in
    # out's type (Nx already made it the merged, floating or integer type the op needs).
    @merged_compute [:equal, :not_equal, :greater, :less, :greater_equal, :less_equal] ++
                      [:logical_and, :logical_or, :logical_xor]

    for op <- ExBurn.Tensor.Ops.binary_ops() do
      @impl true
      def unquote(op)(out, l, r) do
        native unquote(op), out, [l, r] do
          d = device_of([l, r])
          if unquote(op in [:left_shift, :right_shift]), do: check_shift!(unquote(op), r, d)

          compute =
            if unquote(op in @merged_compute),
              do: Nx.Type.merge(l.type, r.type),
              else: out.type

          put(out, wrap_native(Native.binary(unquote(op), ref(l, d), ref(r, d), compute)))
        end
      end
    end

    # Like BinaryBackend, a negative shift amount is an ArgumentError rather than a
    # device-defined result.
    defp check_shift!(op, %T{type: {:s, _}} = r, device) do
      min = et(r, device) |> ET.reduce_min() |> ET.to_flat_list() |> hd()

      if min < 0 do
        verb = if op == :left_shift, do: "left", else: "right"
        raise ArgumentError, "cannot #{verb} shift by #{min}"
      end
    end

    defp check_shift!(_op, _r, _device), do: :ok

    @nx_unary Enum.map(Nx.Shared.unary_math_funs(), &elem(&1, 0)) ++
                [:abs, :bitwise_not, :ceil, :floor, :negate, :round, :sign] ++
                [:count_leading_zeros, :population_count, :is_nan, :is_infinity]

    for op <- @nx_unary do
      if op in ExBurn.Tensor.Ops.unary_ops() do
        @impl true
        def unquote(op)(out, t) do
          native unquote(op), out, [t] do
            put(out, wrap_native(Native.unary(unquote(op), ref(t, nil), out.type)))
          end
        end
      else
        @impl true
        def unquote(op)(out, t), do: fallback(unquote(op), out, [t])
      end
    end

    # Real tensors: real/1 is a cast and imag/1 is zero; conjugate (complex output) and complex
    # inputs fall back.
    @impl true
    def real(out, t) do
      native :real, out, [t] do
        put(out, ET.as_type(et(t, nil), out.type))
      end
    end

    @impl true
    def imag(out, t) do
      native :imag, out, [t] do
        put(out, ET.zeros(out.shape, out.type, device: device_of([t])))
      end
    end

    @impl true
    def conjugate(out, t), do: fallback(:conjugate, out, [t])

    ## Reductions and dot

    for op <- [:sum, :product, :reduce_max, :reduce_min, :all, :any] do
      @impl true
      def unquote(op)(out, t, opts) do
        native unquote(op), out, [t, opts] do
          keep = opts[:keep_axes] == true
          put(out, wrap_native(Native.reduce(unquote(op), ref(t, nil), opts[:axes], keep, out.type)))
        end
      end
    end

    for op <- [:argmax, :argmin] do
      @impl true
      def unquote(op)(out, t, opts) do
        native unquote(op), out, [t, opts] do
          put(out, arg_reduce(unquote(op), et(t, nil), opts, out.type))
        end
      end
    end

    # Nx ranks NaN above everything for both argmax and argmin (BinaryBackend's comparisons
    # return NaN's position), while Burn's comparisons are false on NaN. A float tensor that
    # holds a NaN (one read to find out) takes the first NaN's index where its slice has one.
    defp arg_reduce(op, x, opts, type) do
      keep = opts[:keep_axis] == true
      tie = opts[:tie_break] || :low
      axis = opts[:axis]
      plain = wrap_native(Native.arg_reduce(op, x.ref, axis, keep, tie, type))

      if Type.float?(x.type) and ET.any(ET.is_nan(x)) |> ET.to_flat_list() == [1] do
        nan = ET.is_nan(x)
        first_nan = wrap_native(Native.arg_reduce(:argmax, nan.ref, axis, keep, tie, type))
        axes = if axis, do: [axis], else: nil
        has_nan = wrap_native(Native.reduce(:any, nan.ref, axes, keep, {:u, 8}))
        ET.select(has_nan, first_nan, plain) |> ET.as_type(type)
      else
        plain
      end
    end

    @impl true
    def dot(out, l, contract_l, batch_l, r, contract_r, batch_r) do
      native :dot, out, [l, contract_l, batch_l, r, contract_r, batch_r] do
        d = device_of([l, r])
        answer = Native.dot(ref(l, d), contract_l, batch_l, ref(r, d), contract_r, batch_r, out.type)
        put(out, wrap_native(answer))
      end
    end

    ## Blocks

    @cumulative %{
      Nx.Block.CumulativeSum => :cumulative_sum,
      Nx.Block.CumulativeProduct => :cumulative_product,
      Nx.Block.CumulativeMin => :cumulative_min,
      Nx.Block.CumulativeMax => :cumulative_max
    }

    @impl true
    def block(%mod{} = struct, output, args, fun) do
      if native_block?(mod, output, args) do
        native_block(struct, output, args)
      else
        apply(fun, [struct | args])
      end
    end

    defp native_block?(mod, output, args) do
      (Map.has_key?(@cumulative, mod) or
         mod in [Nx.Block.Take, Nx.Block.TakeAlongAxis, Nx.Block.TopK, Nx.Block.LogicalNot]) and
        output |> List.wrap() |> Enum.flat_map(&flat_templates/1) |> Enum.all?(&native_type?(&1.type)) and
        native_args?(args)
    end

    defp flat_templates(tuple) when is_tuple(tuple), do: Tuple.to_list(tuple)
    defp flat_templates(t), do: [t]

    defp native_block(%mod{axis: axis, reverse: reverse}, out, [t]) when is_map_key(@cumulative, mod) do
      x = ET.as_type(et(t, nil), out.type)
      op = Map.fetch!(@cumulative, mod)
      put(out, wrap_native(Native.cumulative(op, x.ref, axis, reverse)))
    end

    defp native_block(%Nx.Block.Take{axis: axis}, out, [t, idx]) do
      d = device_of([t, idx])
      put(out, wrap_native(Native.take(ref(t, d), ref(idx, d), axis)))
    end

    defp native_block(%Nx.Block.TakeAlongAxis{axis: axis}, out, [t, idx]) do
      d = device_of([t, idx])
      put(out, wrap_native(Native.take_along_axis(ref(t, d), ref(idx, d), axis)))
    end

    defp native_block(%Nx.Block.TopK{k: k}, {values_out, idx_out}, [t]) do
      x = et(t, nil)
      axis = tuple_size(x.shape) - 1
      order = wrap_native(Native.argsort(x.ref, axis, true, {:s, 64}))
      dims = Tuple.to_list(x.shape)
      starts = Enum.map(dims, fn _ -> 0 end)
      top = ET.slice(order, starts, List.replace_at(dims, axis, k))
      values = wrap_native(Native.take_along_axis(x.ref, top.ref, axis))
      {put(values_out, values), put(idx_out, top)}
    end

    defp native_block(%Nx.Block.LogicalNot{}, out, [t]) do
      put(out, wrap_native(Native.unary(:logical_not, ref(t, nil), {:u, 8})))
    end

    ## Reordering and indexing

    @impl true
    def reverse(out, t, axes) do
      native :reverse, out, [t, axes] do
        put(out, wrap_native(Native.reverse(ET.as_type(et(t, nil), out.type).ref, axes)))
      end
    end

    @impl true
    def sort(out, t, opts) do
      native :sort, out, [t, opts] do
        x = ET.as_type(et(t, nil), out.type)
        put(out, wrap_native(Native.sort(x.ref, opts[:axis], opts[:direction] == :desc)))
      end
    end

    @impl true
    def argsort(out, t, opts) do
      native :argsort, out, [t, opts] do
        answer = Native.argsort(ref(t, nil), opts[:axis], opts[:direction] == :desc, out.type)
        put(out, wrap_native(answer))
      end
    end

    @impl true
    def put_slice(out, t, starts, slice) do
      native :put_slice, out, [t, starts, slice] do
        d = device_of([t, slice])
        starts = clamp_starts(starts, t.shape, Tuple.to_list(slice.shape))
        x = ET.as_type(et(t, d), out.type)
        put(out, wrap_native(Native.put_slice(x.ref, starts, ref(slice, d))))
      end
    end

    @impl true
    def gather(out, t, idx, opts) do
      native :gather, out, [t, idx, opts] do
        d = device_of([t, idx])
        axes = opts[:axes]
        {x, flat} = linearize(et(t, d), et(idx, d), axes)
        put(out, wrap_native(Native.take(x.ref, flat.ref, 0)))
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
      @impl true
      def unquote(name)(out, t, idx, updates, opts) do
        native unquote(name), out, [t, idx, updates, opts] do
          d = device_of([t, idx, updates])
          indexed(unquote(op), out, et(t, d), et(idx, d), et(updates, d), opts[:axes])
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
      put(out, if(perm == Enum.sort(perm), do: r, else: ET.transpose(r, axes: inverse)))
    end

    @impl true
    def pad(out, t, pad_value, config) do
      native :pad, out, [t, pad_value, config] do
        d = device_of([t, pad_value])
        x = ET.as_type(et(t, d), out.type)
        value = ET.as_type(et(pad_value, d), out.type)
        interior = Enum.map(config, &elem(&1, 2))

        # Interior padding first: negative edges then cut into the interior-padded tensor, as in
        # BinaryBackend.
        x =
          if Enum.all?(interior, &(&1 == 0)),
            do: x,
            else: wrap_native(Native.pad_interior(x.ref, value.ref, interior))

        put(out, edge_pad(x, value, config))
      end
    end

    # Positive edges are concatenated blocks of the pad value; negative ones are sliced off.
    defp edge_pad(x, value, config) do
      config
      |> Enum.with_index()
      |> Enum.reduce(x, fn {{lo, hi, _interior}, axis}, x ->
        x = grow(x, value, axis, max(lo, 0), :lo)
        x = grow(x, value, axis, max(hi, 0), :hi)
        shrink(x, axis, max(-lo, 0), max(-hi, 0))
      end)
    end

    defp grow(x, _value, _axis, 0, _side), do: x

    defp grow(x, value, axis, n, side) do
      shape = put_elem(x.shape, axis, n)
      block = wrap_native(Native.broadcast(value.ref, Tuple.to_list(shape), []))
      parts = if side == :lo, do: [block, x], else: [x, block]

      if ExBurn.Tensor.Util.size(x.shape) == 0 and elem(x.shape, axis) == 0,
        do: block,
        else: ET.concatenate(parts, axis: axis)
    end

    defp shrink(x, _axis, 0, 0), do: x

    defp shrink(x, axis, lo, hi) do
      dims = Tuple.to_list(x.shape)
      starts = dims |> Enum.map(fn _ -> 0 end) |> List.replace_at(axis, lo)
      lengths = List.replace_at(dims, axis, max(elem(x.shape, axis) - lo - hi, 0))
      ET.slice(x, starts, lengths)
    end

    ## Convolution and windows

    @impl true
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
        fallback(:conv, out, [t, k, opts])
      end
    end

    for op <- [:window_sum, :window_product, :window_max, :window_min] do
      @impl true
      def unquote(op)(out, t, window, opts) do
        native unquote(op), out, [t, window, opts] do
          ones = List.duplicate(1, tuple_size(t.shape))
          spec = {Tuple.to_list(window), opts[:strides], opts[:padding], opts[:window_dilations] || ones}
          put(out, wrap_native(Native.window_reduce(unquote(op), ref(t, nil), spec, out.type)))
        end
      end
    end

    for op <- [:window_scatter_max, :window_scatter_min] do
      @impl true
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
          fallback(unquote(op), out, [t, source, init, window, opts])
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

    ## Fallbacks (no Burn kernel: they take Elixir functions, or Burn lacks the op)

    @fallbacks [
      reduce: 5,
      window_reduce: 6,
      triangular_solve: 4,
      fft: 3,
      ifft: 3
    ]

    for {name, arity} <- @fallbacks do
      [out | args] = Macro.generate_arguments(arity, __MODULE__)

      @impl true
      def unquote(name)(unquote(out), unquote_splicing(args)),
        do: fallback(unquote(name), unquote(out), unquote(args))
    end
  end
end
