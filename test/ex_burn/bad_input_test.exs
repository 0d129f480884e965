defmodule ExBurn.BadInputTest do
  # Malformed input must come back as ExBurn.Error (or {:error, {op, reason, details}} from the raw
  # NIFs), never crash the VM or raise anything else.
  use ExUnit.Case, async: false
  import Bitwise
  alias ExBurn.{Native, Tensor, Type}
  alias ExBurn.Tensor.Ops

  defp t(data, type), do: Tensor.tensor(data, type: type)

  # Tensor API cases: {label, fun} where fun must raise ExBurn.Error.
  defp api_cases do
    m = t([[1, 2, 3], [4, 5, 6]], :s32)
    v = t([1, 2, 3, 4], :s32)

    wrong_sizes =
      for type <- Type.all(), {shape, delta} <- [{{2}, 1}, {{3, 3}, -1}, {{1}, 3}, {{}, 1}] do
        bytes = max(Tuple.product(shape) * Type.byte_size(type) + delta, 0)

        {"from_binary #{inspect(type)} #{inspect(shape)} with #{bytes} bytes",
         fn -> Tensor.from_binary(:binary.copy(<<1>>, bytes), type, shape: shape) end}
      end

    bad_types =
      for type <- [:f8, {:f, 8}, {:c, 64}, {:s, 7}, {:u, 128}, "f32", nil, 32, {:f}, [:f, 32]],
          {name, fun} <- [
            from_binary: &Tensor.from_binary(<<0, 0, 0, 0>>, &1),
            zeros: &Tensor.zeros({2}, &1),
            iota: &Tensor.iota({2}, &1),
            as_type: &Tensor.as_type(m, &1),
            argmax: &Tensor.argmax(m, type: &1)
          ] do
        {"#{name} with type #{inspect(type)}", fn -> fun.(type) end}
      end

    mismatched =
      for op <- Ops.binary_ops(), {a, b} <- [{m, v}, {v, m}] do
        {"#{op} #{inspect(a.shape)} with #{inspect(b.shape)}", fn -> apply(Tensor, op, [a, b]) end}
      end

    non_binary =
      for data <- [[1, 2], :atom, 123, {1}, ~c"abc", 1.5, %{}, self()] do
        {"from_binary with #{inspect(data)}", fn -> Tensor.from_binary(data, :u8) end}
      end

    bad_shapes =
      for shape <- [{-1}, {2, -3}, [-1], :foo, "2x3", %{}, {1.5}, {:a}, nil, [[2]], 1.5],
          {name, fun} <- [
            zeros: &Tensor.zeros(&1, :f32),
            full: &Tensor.full(1, &1, :s32),
            iota: &Tensor.iota(&1, :s32),
            reshape: &Tensor.reshape(v, &1)
          ] do
        {"#{name} with shape #{inspect(shape)}", fn -> fun.(shape) end}
      end

    bad_axes =
      for axes <- [:foo, [0.5], [0, 0], [2], [-3], "0", [nil]],
          {name, fun} <- [
            sum: &Tensor.sum(m, axes: &1),
            mean: &Tensor.mean(m, axes: &1),
            reduce_max: &Tensor.reduce_max(m, axes: &1),
            transpose: &Tensor.transpose(m, axes: &1)
          ] do
        {"#{name} with axes #{inspect(axes)}", fn -> fun.(axes) end}
      end

    bad_axis =
      for axis <- [2, -3, 5, :x, 1.0, "1"],
          {name, fun} <- [
            argmax: &Tensor.argmax(m, axis: &1),
            argmin: &Tensor.argmin(m, axis: &1),
            concatenate: &Tensor.concatenate([m, m], axis: &1),
            iota: &Tensor.iota({2, 2}, :s32, axis: &1),
            squeeze: &Tensor.squeeze(m, axes: [&1]),
            dot: &Tensor.dot(m, [&1], [], m, [1], [])
          ] do
        {"#{name} with axis #{inspect(axis)}", fn -> fun.(axis) end}
      end

    misc = [
      {"stack axis out of range", fn -> Tensor.stack([v, v], axis: 3) end},
      {"new_axis out of range", fn -> Tensor.new_axis(v, 5) end},
      {"stack different shapes", fn -> Tensor.stack([v, m]) end},
      {"concatenate different ranks", fn -> Tensor.concatenate([v, m]) end},
      {"concatenate empty list", fn -> Tensor.concatenate([]) end},
      {"concatenate non-tensors", fn -> Tensor.concatenate([:a, :b]) end},
      {"reshape to another size", fn -> Tensor.reshape(m, {4, 2}) end},
      {"broadcast incompatible", fn -> Tensor.broadcast(m, {2, 4}) end},
      {"broadcast to lower rank", fn -> Tensor.broadcast(m, {6}) end},
      {"slice length beyond dim", fn -> Tensor.slice(m, [0, 0], [3, 1]) end},
      {"slice wrong rank", fn -> Tensor.slice(m, [0], [1]) end},
      {"slice zero stride", fn -> Tensor.slice(m, [0, 0], [1, 1], strides: 0) end},
      {"dot mismatched contraction", fn -> Tensor.dot(m, m) end},
      {"dot/6 mismatched sizes", fn -> Tensor.dot(m, [0], [], m, [1], []) end},
      {"squeeze non-1 axis", fn -> Tensor.squeeze(m, axes: [0]) end},
      {"transpose not a permutation", fn -> Tensor.transpose(m, axes: [0]) end},
      {"quotient of floats", fn -> Tensor.quotient(t([1.0], :f32), t([1.0], :f32)) end},
      {"bitwise_and of floats", fn -> Tensor.bitwise_and(t([1.0], :f32), 1) end},
      {"population_count of floats", fn -> Tensor.population_count(t([1.0], :f64)) end},
      {"add with an atom", fn -> Tensor.add(m, :foo) end},
      {"add with a string", fn -> Tensor.add("a", m) end},
      {"exp of a list", fn -> Tensor.exp([1, 2]) end},
      {"sum of a map", fn -> Tensor.sum(%{}) end},
      {"unknown option", fn -> Tensor.sum(m, axis: [0]) end},
      {"options not a keyword list", fn -> Tensor.sum(m, :foo) end},
      {"bad keep_axes", fn -> Tensor.sum(m, keep_axes: :yes) end},
      {"bad tie_break", fn -> Tensor.argmax(m, tie_break: :middle) end},
      {"float argmax type", fn -> Tensor.argmax(m, type: :f32) end},
      {"bad device", fn -> Tensor.zeros({2}, :f32, device: :tpu) end},
      {"bad device index", fn -> Tensor.zeros({2}, :f32, device: {:cpu, -1}) end},
      {"device not present", fn -> Tensor.zeros({2}, :f32, device: {:cpu, 99}) end},
      {"to_device bad", fn -> Tensor.to_device(m, "gpu") end},
      {"negative limit", fn -> Tensor.to_binary(m, -1) end},
      {"float fill for int type", fn -> Tensor.full(1.5, {2}, :s32) end},
      {"nan fill for int type", fn -> Tensor.full(:nan, {2}, :u8) end},
      {"non-number fill", fn -> Tensor.full("1", {2}, :f32) end},
      {"clip with non-scalar bounds", fn -> Tensor.clip(m, v, v) end},
      {"select incompatible", fn -> Tensor.select(t([1, 0], :u8), m, v) end},
      {"eye of rank 1", fn -> Tensor.eye({3}, :f32) end},
      {"ragged tensor/2 data", fn -> Tensor.tensor([[1, 2], [3]]) end},
      {"forged struct",
       fn -> Tensor.exp(%Tensor{ref: make_ref(), shape: {1}, type: {:f, 32}, device: {:cpu, 0}}) end}
    ]

    huge =
      for shape <- [{1_000_000_000_000}, {1 <<< 40, 1 <<< 40}, {1 <<< 62}, {1 <<< 31, 1 <<< 31, 4}],
          {name, fun} <- [
            zeros: &Tensor.zeros(&1, :f32),
            ones: &Tensor.ones(&1, :u8),
            full: &Tensor.full(2.0, &1, :f64),
            iota: &Tensor.iota(&1, :s64),
            from_binary: &Tensor.from_binary(<<0, 0, 0, 0>>, :f32, shape: &1),
            reshape: &Tensor.reshape(v, &1)
          ] do
        {"#{name} with huge shape #{inspect(shape)}", fn -> fun.(shape) end}
      end

    huge_eye = [{"eye huge", fn -> Tensor.eye({1 <<< 40, 1 <<< 40}, :f32) end}]

    wrong_sizes ++
      bad_types ++
      mismatched ++ non_binary ++ bad_shapes ++ bad_axes ++ bad_axis ++ misc ++ huge ++ huge_eye
  end

  # Every op applied to a deallocated tensor.
  defp deallocated_cases do
    dead = t([[1, 2], [3, 4]], :s32)
    assert Tensor.deallocate(dead) == :ok
    live = t([[1, 2], [3, 4]], :s32)

    unary = for op <- Ops.unary_ops(), do: {"#{op} of deallocated", fn -> apply(Tensor, op, [dead]) end}

    binary =
      for op <- Ops.binary_ops(), args <- [[dead, live], [live, dead], [dead, 1]] do
        {"#{op} with deallocated operand", fn -> apply(Tensor, op, args) end}
      end

    reductions =
      for op <- Ops.reductions() ++ [:argmax, :argmin], opts <- [[], [axes: [0]]] do
        opts = if op in [:argmax, :argmin], do: Enum.map(opts, fn {:axes, [a]} -> {:axis, a} end), else: opts
        {"#{op} of deallocated", fn -> apply(Tensor, op, [dead, opts]) end}
      end

    others = [
      to_binary: fn -> Tensor.to_binary(dead) end,
      to_binary_limit: fn -> Tensor.to_binary(dead, 1) end,
      as_type: fn -> Tensor.as_type(dead, :f32) end,
      to_device: fn -> Tensor.to_device(dead, :cpu) end,
      reshape: fn -> Tensor.reshape(dead, {4}) end,
      transpose: fn -> Tensor.transpose(dead) end,
      broadcast: fn -> Tensor.broadcast(dead, {3, 2, 2}) end,
      slice: fn -> Tensor.slice(dead, [0, 0], [1, 1]) end,
      concatenate: fn -> Tensor.concatenate([live, dead]) end,
      stack: fn -> Tensor.stack([dead, live]) end,
      new_axis: fn -> Tensor.new_axis(dead, 0) end,
      dot: fn -> Tensor.dot(dead, live) end,
      dot6: fn -> Tensor.dot(live, [1], [], dead, [0], []) end,
      select_pred: fn -> Tensor.select(dead, live, live) end,
      select_branch: fn -> Tensor.select(live, dead, live) end,
      clip: fn -> Tensor.clip(dead, 0, 1) end
    ]

    unary ++ binary ++ reductions ++ Enum.map(others, fn {name, fun} -> {"#{name} of deallocated", fun} end)
  end

  # Raw NIF calls with arguments of the wrong kind: each must answer {:error, {op, reason, details}}.
  defp nif_cases do
    ref = t([1.0, 2.0], :f32).ref
    junk = [:junk, "string", self(), {[1, %{a: 2}], ~c"x", [[[]]]}, 1.5, -1, make_ref(), [ref]]

    # Well-formed by contract: a models directory that does not exist lists no models.
    valid = [{:pretrained_list, ["string"]}]

    all_junk =
      for {name, arity} <- Native.nifs(),
          arity > 0,
          value <- junk,
          {name, List.duplicate(value, arity)} not in valid do
        {"#{name}/#{arity} with every argument #{inspect(value)}", name, List.duplicate(value, arity)}
      end

    mixed = [
      {"binary with junk rhs", :binary, [:add, ref, :junk, {:f, 32}]},
      {"binary with unknown op", :binary, [:frobnicate, ref, ref, {:f, 32}]},
      {"binary with bad compute type", :binary, [:add, ref, ref, {:f, 8}]},
      {"binary shape mismatch", :binary, [:add, ref, t([1.0, 2.0, 3.0], :f32).ref, {:f, 32}]},
      {"unary with unknown op", :unary, [:frobnicate, ref, {:f, 32}]},
      {"unary with bad type", :unary, [:exp, ref, :f32]},
      {"reduce with unknown op", :reduce, [:median, ref, nil, false, {:f, 32}]},
      {"reduce with axis out of range", :reduce, [:sum, ref, [3], false, {:f, 32}]},
      {"reduce with negative axis", :reduce, [:sum, ref, [-1], false, {:f, 32}]},
      {"arg_reduce with bad tie_break", :arg_reduce, [:argmax, ref, 0, false, :middle, {:s, 64}]},
      {"arg_reduce with float type", :arg_reduce, [:argmax, ref, 0, false, :low, {:f, 32}]},
      {"from_binary wrong size", :from_binary, [<<1, 2, 3>>, [1], {:f, 32}, {:cpu, 0}]},
      {"from_binary negative dim", :from_binary, [<<>>, [-1], {:f, 32}, {:cpu, 0}]},
      {"from_binary bad device", :from_binary, [<<0, 0, 0, 0>>, [1], {:f, 32}, {:tpu, 0}]},
      {"from_binary huge shape", :from_binary, [<<0, 0, 0, 0>>, [1 <<< 40, 1 <<< 40], {:f, 32}, {:cpu, 0}]},
      {"full huge shape", :full, [0, [1_000_000_000_000], {:f, 32}, {:cpu, 0}]},
      {"full overflowing shape", :full, [0, [1 <<< 40, 1 <<< 40], {:f, 32}, {:cpu, 0}]},
      {"full dims beyond u64", :full, [0, [1 <<< 70], {:f, 32}, {:cpu, 0}]},
      {"iota huge shape", :iota, [[1_000_000_000_000], {:s, 64}, nil, {:cpu, 0}]},
      {"eye huge shape", :eye, [[1 <<< 40, 1 <<< 40], {:f, 32}, {:cpu, 0}]},
      {"iota axis out of range", :iota, [[2], {:s, 64}, 1, {:cpu, 0}]},
      {"to_binary negative limit", :to_binary, [ref, -1]},
      {"reshape size mismatch", :reshape, [ref, [3]]},
      {"transpose bad permutation", :transpose, [ref, [0, 0]]},
      {"broadcast bad axes", :broadcast, [ref, [2, 2], [5], {:f, 32}]},
      {"slice longer than its axis", :slice, [ref, [0], [3], [1]]},
      {"slice with a non-scalar start", :slice, [ref, [ref], [1], [1]]},
      {"gather with junk axes", :gather, [ref, ref, [:x]]},
      {"indexed with unknown op", :indexed, [:frobnicate, ref, ref, ref, [0], {:f, 32}]},
      {"slice zero stride", :slice, [ref, [0], [1], [0]]},
      {"concatenate empty", :concatenate, [[], 0, {:f, 32}]},
      {"stack with junk", :stack, [[ref, :junk], 0, {:f, 32}]},
      {"dot bad axes", :dot, [ref, [1], [], ref, [0], [], {:f, 32}, nil]},
      {"dot bad precision", :dot, [ref, [1], [], ref, [0], [], {:f, 32}, :medium]},
      {"select with junk", :select, [ref, ref, :junk, {:f, 32}]},
      {"clip with junk", :clip, [ref, :junk, ref, {:f, 32}]},
      {"clip with a bad type", :clip, [ref, ref, ref, {:f, 8}]},
      {"pad with too few axes", :pad, [ref, t([0.0], :f32).ref, [], {:f, 32}]},
      {"pad cutting more than the axis", :pad, [ref, t([0.0], :f32).ref, [{-5, 0, 0}], {:f, 32}]},
      {"pad with negative interior", :pad, [ref, t([0.0], :f32).ref, [{0, 0, -1}], {:f, 32}]},
      {"pad with a non-scalar value", :pad, [ref, ref, [{1, 1, 0}], {:f, 32}]},
      {"sort with a bad type", :sort, [ref, 0, false, :f32]},
      {"reverse to an unknown type", :reverse, [ref, [0], {:q, 4}]},
      {"put_slice with junk update", :put_slice, [ref, [0], :junk, {:f, 32}]},
      {"as_type bad type", :as_type, [ref, {:c, 64}]},
      {"to_device unknown kind", :to_device, [ref, {:tpu, 0}]},
      {"supports_type bad device", :supports_type, [:nowhere, {:f, 32}]}
    ]

    all_junk ++ mixed
  end

  defp check_raises({label, fun}) do
    fun.()
    {:failed, label, :no_error}
  rescue
    e in ExBurn.Error ->
      if is_atom(e.op) and is_binary(e.reason), do: :ok, else: {:failed, label, e}

    e ->
      {:failed, label, e}
  catch
    kind, value -> {:failed, label, {kind, value}}
  end

  defp check_nif({label, name, args}) do
    case apply(Native, name, args) do
      {:error, {op, reason, details}} when is_atom(op) and is_binary(reason) and is_map(details) -> :ok
      other -> {:failed, label, other}
    end
  rescue
    e -> {:failed, label, e}
  catch
    kind, value -> {:failed, label, {kind, value}}
  end

  test "hundreds of malformed calls raise ExBurn.Error or return {:error, _}; the VM survives" do
    results =
      Enum.map(api_cases() ++ deallocated_cases(), &check_raises/1) ++
        Enum.map(nif_cases(), &check_nif/1)

    count = length(results)
    assert count >= 200
    failures = Enum.reject(results, &(&1 == :ok))

    assert failures == [],
           "#{length(failures)} of #{count} malformed calls misbehaved:\n" <>
             Enum.map_join(failures, "\n", fn {:failed, label, got} -> "  #{label}: #{inspect(got)}" end)

    # Still alive and still computing.
    assert Process.alive?(self())
    sum = Tensor.add(t([1, 2], :s32), t([3, 4], :s32))
    assert Tensor.to_flat_list(sum) == [4, 6]
  end

  test "the tensor API's errors name the op" do
    m = t([[1, 2, 3], [4, 5, 6]], :s32)
    assert %ExBurn.Error{op: :add} = assert_raise(ExBurn.Error, fn -> Tensor.add(m, t([1, 2], :s32)) end)
    assert %ExBurn.Error{op: :sum} = assert_raise(ExBurn.Error, fn -> Tensor.sum(m, axes: [7]) end)
    error = assert_raise ExBurn.Error, fn -> Tensor.zeros({2}, :c64) end
    assert Exception.message(error) =~ "unsupported type"
  end
end
