if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.Memory do
    @moduledoc false

    import ExBurn.Backend.Util, except: [to_binary: 2, from_binary: 3]

    alias Nx.Tensor, as: T
    alias ExBurn.{Backend, Native}
    alias ExBurn.Tensor, as: ET
    alias ExBurn.Backend.Util
    alias ExBurn.Backend.Fallback

    def to_binary(t, limit), do: Util.to_binary(t, limit)

    def backend_deallocate(%T{data: %Backend{ref: ref}}) when is_reference(ref),
      do: ExBurn.Error.unwrap!(Native.deallocate(ref))

    def backend_deallocate(_), do: :ok

    def backend_copy(%T{} = t, Backend, opts) do
      device = backend_device(opts)

      case t.data do
        %Backend{ref: nil} -> %{t | data: %{t.data | device: device}}
        # to_device always makes a new reference (sharing Burn's buffer on the same device),
        # so deallocating the original leaves the copy alive
        _ -> put(t, ET.to_device(et(t, nil), device))
      end
    end

    def backend_copy(%T{} = t, backend, opts), do: backend.from_binary(t, to_binary(t, nil), opts)

    def backend_transfer(%T{data: %Backend{device: device}} = t, Backend, opts) do
      if backend_device(opts) == device, do: t, else: transfer_and_free(t, Backend, opts)
    end

    def backend_transfer(t, backend, opts), do: transfer_and_free(t, backend, opts)

    defp transfer_and_free(t, backend, opts) do
      copy = backend_copy(t, backend, opts)
      backend_deallocate(t)
      copy
    end

    def inspect(%T{} = t, inspect_opts) do
      limit = if inspect_opts.limit == :infinity, do: nil, else: min(inspect_opts.limit + 1, Nx.size(t))
      Nx.Backend.inspect(t, to_binary(t, limit), inspect_opts)
    end

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

    def from_pointer(_, _, _, _, _),
      do: raise(ArgumentError, "#{inspect(Backend)} does not support pointer manipulation")

    def to_pointer(_, _),
      do: raise(ArgumentError, "#{inspect(Backend)} does not support pointer manipulation")
  end
end
